"""Hypothesis strategies shared by the native property tests."""

from __future__ import annotations

import json

from hypothesis import strategies as st

# -- bytes ------------------------------------------------------------------


def _repeat(unit: bytes, times: int) -> bytes:
    return unit * times


# Random bytes, low-entropy runs (these hit the max-size cut) and JSON text
# (the real workload: many repeated keys and words).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=60,
)
json_bytes = json_values.map(lambda v: json.dumps(v, separators=(",", ":")).encode())
repeated_bytes = st.builds(_repeat, st.binary(min_size=1, max_size=8), st.integers(0, 6000))
payloads = st.one_of(st.binary(max_size=20_000), repeated_bytes, json_bytes)


@st.composite
def chunk_sizes(draw: st.DrawFn) -> tuple[int, int, int]:
    """Valid (min, avg, max) triples, small enough for many chunks per example."""
    min_size = 2 * draw(st.integers(32, 2048))
    avg_size = 2 * draw(st.integers(max(128, min_size // 2), 8192))
    max_size = 2 * draw(st.integers(max(512, avg_size // 2), 32_768))
    return min_size, avg_size, max_size


# -- text -------------------------------------------------------------------

# Characters the recognisers care about, plus unicode that trips careless
# code: non-ASCII letters and digits, the Kelvin sign (lowercases to "k"),
# dotted I, no-break and em spaces, U+001C (whitespace to Python, not to
# Rust) and a zero-width space (whitespace to neither).
_ALPHABET = (
    "abcxyzAPIVRS019_ ./\\:\"'`,;!?()[]{}<>#-+=~@%&\t\n"
    "\u00e9\u0130\u212a\u00a0\u2003\u001c\u200b\u0663\u00b2\u4e2d"
)
_FRAGMENTS = (
    "http://", "https://", "ftp://", "://", "api", "/api/", "/v1/", "/v2", "rest", "graphql",
    "rpc", "users", "list", "src/", "app.py", ".py", ".json", ".YAML", ".txt", ".md", ".tar.gz",
    "C:\\", "~/", "./", "../", "{N}", "{url}", "{file_path}", "{value}", "{", "}", '"', "150",
    "3.5", "1,000", "utf8", "v2", "60s", "py311", ":8080", "?q=1&b=2", "#frag", "example.com",
    " ", "  ", "Deploy ", "Process ", "records", "config.yaml", ".env", "and/or",
)  # fmt: skip

goal_text = st.lists(
    st.one_of(st.sampled_from(_FRAGMENTS), st.text(alphabet=_ALPHABET, max_size=4)),
    max_size=24,
).map("".join)

any_text = st.one_of(goal_text, st.text(max_size=60))
