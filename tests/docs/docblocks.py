"""The code blocks of the documentation, and how each one is run.

Every fenced block in README.md, docs/*.md and the client READMEs is either run
by tests/docs/test_docs_run.py against a real daemon or marked as not meant to
be run. The first word of a block's info string is its language (as GitHub
renders it); the words after it say how it runs:

==============  ==============================================================
``text``        prose in a box (layouts, diagrams, formulas, sample output):
                never run
``illustrative`` (any language) shown, not run: fragments, placeholders for a
                cluster, a registry or a key file of your own. ``python
                tests/docs/docblocks.py`` lists what runs and what does not
``python``      run in one Python process per page, blocks in page order
                sharing their names (as a reader typing them into one REPL)
``sh``/``bash`` run by bash (``set -euo pipefail``); variables a block sets
                are kept for the page's later shell blocks
``console``     ``$ command`` lines are run; every other line is output that
                must appear in what the command printed (``...`` elides); a
                command shown without output must exit 0
``go``          a whole program (``package main``) built and run with the
                checkout's Go client (``replace`` in a scratch module)
``js``          an ES module run by node in the scratch directory (where the
                page's earlier blocks installed ``@stratad/client``)
``toml``        a config file, checked with ``stratad serve --config FILE
                --check-config`` (what serving would refuse, this refuses)
``auth-tokens`` (after toml) the block is an ``auth_tokens_file``: checked with
                ``stratad serve --auth token --auth-tokens-file FILE
                --check-config``
``daemon``      (after sh) the block starts the page's daemon (replacing the
                one running): it runs in the background until the page is
                done, with the variables of the page's earlier shell blocks;
                the next block waits for 127.0.0.1:50051 to serve
==============  ==============================================================

A page without a ``daemon`` block gets one started for it: ``stratad serve``
on 127.0.0.1:50051 (the README's ``make run`` address, which the docs assume)
with a fresh data directory. Blocks run in a scratch directory holding links
to the checkout's top-level entries, so ``.venv/bin/...``, ``bench/`` and
``cd clients/go`` work as written while files a block creates stay out of the
checkout. Why our own extractor rather than pytest-examples: that tool runs
Python blocks only, while a newcomer's path here is half shell, Go, TOML and
console sessions, and blocks of one page depend on each other (a session made
in one block is used in the next).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The pages a newcomer reads, in the order the README points at them.
PAGES: tuple[str, ...] = (
    "README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
    "clients/go/README.md",
    "clients/ts/README.md",
)

RUNNABLE = {"python", "sh", "bash", "console", "go", "js", "toml"}
NEVER_RUN = {"text"}
MODIFIERS = {"illustrative", "daemon", "auth-tokens"}

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>.*)$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    modifiers: frozenset[str]
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUNNABLE and "illustrative" not in self.modifiers

    def problem(self) -> str | None:
        """Why this block's marking is not valid, or None."""
        if not self.language:
            return "no language: name one (text for layouts, diagrams and sample output)"
        unknown = self.modifiers - MODIFIERS
        if unknown:
            return (
                f"unknown words {sorted(unknown)} after the language (known: {sorted(MODIFIERS)})"
            )
        if self.language in NEVER_RUN or "illustrative" in self.modifiers:
            return None
        if self.language not in RUNNABLE:
            return (
                f"{self.language} blocks are not run: mark it '{self.language} illustrative' "
                "or make it one of " + ", ".join(sorted(RUNNABLE))
            )
        if "daemon" in self.modifiers and self.language not in {"sh", "bash"}:
            return "only sh blocks can start the page's daemon"
        if "auth-tokens" in self.modifiers and self.language != "toml":
            return "only a toml block can be an auth_tokens_file"
        if self.language == "go" and not re.search(r"^package main\b", self.body, re.M):
            return "a go block runs as a whole program (package main); mark fragments illustrative"
        return None


def blocks(page: str) -> Iterator[Block]:
    """The fenced code blocks of ``page`` (relative to the checkout), in order."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        words = opening["info"].split()
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        start = index - len(body)  # 1-based line of the opening fence
        yield Block(
            page=page,
            line=start,
            language=words[0] if words else "",
            modifiers=frozenset(words[1:]),
            body="\n".join(body) + "\n",
        )
        index += 1


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


if __name__ == "__main__":  # python tests/docs/docblocks.py: what runs and what does not
    for block in all_blocks():
        kind = "run" if block.runs else "not run"
        print(f"{block.where:32} {block.language:8} {' '.join(sorted(block.modifiers)):14} {kind}")
