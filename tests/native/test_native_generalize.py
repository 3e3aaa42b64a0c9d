"""Goal generalization and entity detection: native == reference."""

from __future__ import annotations

import pytest
import reference as ref
from hypothesis import given, settings
from strategies import any_text, goal_text

native = pytest.importorskip("stratad.native")

# The table of docs/native.md.
CONTRACT_TABLE = [
    ("Deploy src/app.py", "Deploy {file_path}"),
    ("Process 150 records", "Process {N} records"),
    ("Call /api/users/list", "Call {api_endpoint}"),
    ("Visit https://example.com", "Visit {url}"),
    ('Set "production"', 'Set "{value}"'),
]

TRICKY = [
    # Windows paths, ~ and relative paths, bare names with known extensions.
    (r"Open C:\Users\me\report.txt now", "Open {file_path} now"),
    (r"Run .\scripts\build.ps1", "Run {file_path}"),
    ("Edit ~/notes.md and ./run.sh", "Edit {file_path} and {file_path}"),
    ("Read /etc/hosts", "Read {file_path}"),
    ("Fix app.py, config.yaml; README.MD.", "Fix {file_path}, {file_path}; {file_path}."),
    ("keep .env and notes.unknownext", "keep .env and notes.unknownext"),
    ("Use and/or", "Use {file_path}"),
    ("a lone / slash", "a lone / slash"),
    # Wrapping punctuation stays outside the placeholder.
    ("(see src/app.py)", "(see {file_path})"),
    ("`tests/test_x.py`", "`{file_path}`"),
    ("'data/in.csv',", "'{file_path}',"),
    # URLs: ports, queries, fragments, trailing punctuation.
    ("Fetch https://api.example.com:8443/v1/items?id=5&x=y#top.", "Fetch {url}."),
    ("(http://localhost:8080/health)", "({url})"),
    ("ftp://files.example.org/pub/a.tar.gz, then", "{url}, then"),
    ("git+ssh://git@host:22/repo.git", "{url}"),
    ("bare scheme https:// only", "bare scheme {file_path} only"),  # not a URL, has "/"
    # API endpoints versus paths.
    ("GET /api/users/list?page=2", "GET {api_endpoint}"),
    ("POST /v2/orders/42", "POST {api_endpoint}"),
    (
        "query /graphql and /rpc/Call, /rest/items",
        "query {api_endpoint} and {api_endpoint}, {api_endpoint}",
    ),
    ("download /api/export.json", "download {file_path}"),
    ("see /apis/x", "see {file_path}"),
    ("src/api/users is a path", "{file_path} is a path"),
    # Numbers: alone, with separators, inside words.
    ("Process 150 records in 3.5 s for 1,000 users", "Process {N} records in {N} s for {N} users"),
    ("utf8 v2 60s py311 x_1 1_x", "utf8 v2 60s py311 x_1 1_x"),
    ("version 1.2.3 on 2024-01-05 at 10:30", "version {N} on {N}-{N}-{N} at {N}:{N}"),
    ("retry 3x then 4 times.", "retry 3x then {N} times."),
    ("-5 and +7", "-{N} and +{N}"),
    # Several placeholders, existing placeholders, quotes.
    (
        'Deploy src/app.py to https://prod.example.com with "fast" mode 3 times',
        'Deploy {file_path} to {url} with "{value}" mode {N} times',
    ),
    ("Deploy app.py to https://prod.example.com", "Deploy {file_path} to {url}"),
    ("already {file_path} and {N}", "already {file_path} and {N}"),
    ('Set "{value}" again', 'Set "{value}" again'),
    ('Set "" empty', 'Set "" empty'),
    ('quote "https://x.com/a b" inside', 'quote "{value}" inside'),
    # Unicode.
    ("Déployer src/été.py en 5 minutes", "Déployer {file_path} en {N} minutes"),
    ("café5 naïve 5", "café{N} naïve {N}"),  # letters are ASCII only
    ("处理 150 条记录", "处理 {N} 条记录"),
    ("no\u00a0break\u00a012", "no\u00a0break\u00a0{N}"),
    ("", ""),
]


@pytest.mark.parametrize(("goal", "expected"), CONTRACT_TABLE + TRICKY)
def test_vectors(goal: str, expected: str) -> None:
    assert ref.generalize_goal(goal) == expected
    assert native.generalize_goal(goal) == expected


@settings(max_examples=400, deadline=None)
@given(any_text)
def test_generalize_matches_reference(goal: str) -> None:
    assert native.generalize_goal(goal) == ref.generalize_goal(goal)


@settings(max_examples=200, deadline=None)
@given(goal_text)
def test_generalize_its_own_output(goal: str) -> None:
    # Outputs are full of placeholders: a good second source of inputs.
    once = ref.generalize_goal(goal)
    assert native.generalize_goal(once) == ref.generalize_goal(once)


ENTITY_VECTORS = [
    ("Deploy src/app.py", ["python_file"]),
    ("Process 150 records", ["number"]),
    ("Call /api/users/list", ["api_endpoint"]),
    ("Visit https://example.com", ["url"]),
    ('Set "production"', ["quoted_value"]),
    (
        'Load data.csv, run deploy.sh, open "x" at https://a.io/p 3 times via /v1/x',
        ["data_file", "shell_script", "quoted_value", "url", "number", "api_endpoint"],
    ),
    ("a.ts b.tsx c.js d.mjs e.toml f.rst g.sql h.rs i.png j/k", [
        "typescript_file", "javascript_file", "config_file", "document_file", "sql_file",
        "source_file", "file"]),
    (r"C:\x\NOTES.PDF and lib.PYI", ["document_file", "python_file"]),
    ("src/app.py then tests/b.py then 5", ["python_file", "number"]),
    ("already {file_path} {N}", []),
    ("nothing here", []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "types"), ENTITY_VECTORS)
def test_entity_vectors(text: str, types: list[str]) -> None:
    assert ref.detect_entity_types(text) == types
    assert native.detect_entity_types(text) == types


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_entities_match_reference(text: str) -> None:
    assert native.detect_entity_types(text) == ref.detect_entity_types(text)
