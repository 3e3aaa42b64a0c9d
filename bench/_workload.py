"""The reference workload of docs/design.md: the growing conversation.

Step i (0-based) is the JSON state

    {"messages": [m0 ... mi], "step": i, "scratch": {"tool": "search", "n": i}}

where message j is {"role": "user" if j is even else "assistant", "content":
80 words}. All words come from ONE random.Random(7) stream, drawn with
.choice() message by message in order (message 0 takes the first 80 draws,
message 1 the next 80, ...), so message j is the same in every step. The
vocabulary is the word list of the sentence below, duplicates included (the
spec says "the words of" the sentence, i.e. sentence.split()). States are
serialized with json.dumps(state, separators=(",", ":")) and UTF-8 encoded.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

SENTENCE = (
    "the agent decided to call the search tool because the user asked about quarterly "
    "revenue figures and then it summarized results into a table with notes about errors "
    "retries and timeouts"
)
WORDS: tuple[str, ...] = tuple(SENTENCE.split())
WORDS_PER_MESSAGE = 80
SEED = 7


class _Messages:
    """The message list, extended on demand from the single shared stream."""

    def __init__(self) -> None:
        self._rng = random.Random(SEED)
        self.items: list[dict[str, str]] = []

    def upto(self, n: int) -> list[dict[str, str]]:
        """The first n messages (drawing more from the stream if needed)."""
        while len(self.items) < n:
            j = len(self.items)
            words = [self._rng.choice(WORDS) for _ in range(WORDS_PER_MESSAGE)]
            role = "user" if j % 2 == 0 else "assistant"
            self.items.append({"role": role, "content": " ".join(words)})
        return self.items[:n]


_MESSAGES = _Messages()


def message(j: int) -> dict[str, str]:
    """Message j of the conversation."""
    return _MESSAGES.upto(j + 1)[j]


def _state(messages: list[dict[str, str]], i: int) -> bytes:
    state = {"messages": messages, "step": i, "scratch": {"tool": "search", "n": i}}
    return json.dumps(state, separators=(",", ":")).encode()


def conversation_state(i: int) -> bytes:
    """The JSON bytes saved at step i (messages 0..i)."""
    if i < 0:
        raise ValueError("step must be >= 0")
    return _state(_MESSAGES.upto(i + 1), i)


def conversation_states(n: int) -> Iterator[bytes]:
    """The JSON bytes of steps 0..n-1, lazily (their total size grows as n**2)."""
    messages = _MESSAGES.upto(n)
    for i in range(n):
        yield _state(messages[: i + 1], i)


def _state_len(message_lens: int, count: int, i: int) -> int:
    # '{"messages":[' + messages joined by ',' + '],"step":i,"scratch":{...}}'
    tail = f'],"step":{i},"scratch":{{"tool":"search","n":{i}}}}}'
    return len('{"messages":[') + message_lens + (count - 1) + len(tail)


def step_of_size(nbytes: int) -> int:
    """The first step whose state is at least nbytes long."""
    total = 0
    i = 0
    while True:
        total += len(json.dumps(message(i), separators=(",", ":")))
        if _state_len(total, i + 1, i) >= nbytes:
            return i
        i += 1


def state_of_size(nbytes: int) -> bytes:
    """The state of the first step that is at least nbytes long."""
    return conversation_state(step_of_size(nbytes))
