"""`stratad.ctl.decode` (diffs, JSON of LangGraph values) and the completion
scripts of `stratad ctl completion`, exercised in the real shells."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from stratad.cli import build_parser
from stratad.ctl import decode, subcommands
from stratad.ctl.commands import COMMANDS
from stratad.ctl.completion import command_tree, completion_script
from stratad.errors import InvalidArgumentError
from stratad.integrations import langgraph

# --- decode -------------------------------------------------------------------------------


def test_diff_names_every_difference_by_json_pointer() -> None:
    before = {"a": 1, "list": [1, 2, 3], "nested": {"x": "old", "gone": True}, "t": 1}
    after = {"a": 1, "list": [1, 5], "nested": {"x": "new", "new/key~": 0}, "t": "1"}
    assert decode.diff(before, after) == [
        {"op": "changed", "path": "/list/1", "before": 2, "after": 5},
        {"op": "removed", "path": "/list/2", "before": 3},
        {"op": "changed", "path": "/nested/x", "before": "old", "after": "new"},
        {"op": "removed", "path": "/nested/gone", "before": True},
        {"op": "added", "path": "/nested/new~1key~0", "after": 0},
        {"op": "changed", "path": "/t", "before": 1, "after": "1"},
    ]
    assert decode.diff(before, before) == []
    # 1 == 1.0 == True in Python; not the same JSON value.
    assert decode.diff({"n": 1}, {"n": True}) == [
        {"op": "changed", "path": "/n", "before": 1, "after": True}
    ]
    assert decode.diff([1], {"a": 1}) == [
        {"op": "changed", "path": "", "before": [1], "after": {"a": 1}}
    ]


def test_byte_diff_summarises_opaque_states() -> None:
    assert decode.byte_diff(b"same", b"same")["identical"] is True
    summary = decode.byte_diff(b"abcXdef", b"abcYYdef")
    assert summary["first_difference_at"] == 3
    assert (summary["common_prefix_bytes"], summary["common_suffix_bytes"]) == (3, 3)
    assert (summary["size_a"], summary["size_b"]) == (7, 8)
    assert decode.byte_diff(b"", b"x")["first_difference_at"] == 0


def test_decode_picks_json_or_bytes_and_refuses_what_was_asked_wrongly() -> None:
    assert decode.decode(b'{"a": 1}', "application/json") == decode.Decoded("json", {"a": 1})
    assert decode.decode(b"\xff\x00", "") == decode.Decoded("bytes", b"\xff\x00")
    assert decode.decode(b'{"a": 1}', "", "raw").kind == "bytes"
    with pytest.raises(InvalidArgumentError, match="not JSON"):
        decode.decode(b"\xff", "", "json")
    with pytest.raises(InvalidArgumentError, match="not a checkpoint StratadSaver stored"):
        decode.decode(b"{}", "application/json", "langgraph")
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        decode.decode(b"\xc1", decode.LANGGRAPH_CONTENT_TYPE_PREFIX + "msgpack")
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        decode.decode(b"{}", decode.LANGGRAPH_CONTENT_TYPE_PREFIX + "pickle-v9")


def test_the_langgraph_content_type_is_the_savers() -> None:
    assert decode.LANGGRAPH_CONTENT_TYPE_PREFIX == langgraph.CONTENT_TYPE_PREFIX


def test_to_jsonable_turns_langgraph_values_into_json() -> None:
    from langchain_core.messages import HumanMessage

    @dataclasses.dataclass
    class Point:
        x: int

    value = {
        "messages": [HumanMessage(content="hi", id="m1")],
        "tags": {"b", "a"},
        "blob": b"\x00\x01",
        "point": Point(3),
        "pair": (1, 2),
    }
    out = decode.to_jsonable(value)
    assert out["messages"][0]["$type"] == "HumanMessage"
    assert out["messages"][0]["content"] == "hi"
    assert out["tags"] == ["a", "b"]
    assert out["blob"] == {"$bytes_base64": "AAE="}
    assert out["point"] == {"$type": "Point", "x": 3}
    assert out["pair"] == [1, 2]


# --- completion ---------------------------------------------------------------------------


def test_the_tree_has_every_ctl_command_and_the_global_options_everywhere() -> None:
    nodes = {n.path: n for n in command_tree(build_parser())}
    for command in COMMANDS:
        node = nodes["stratad ctl " + " ".join(command)]
        assert "--json" in node.options and "--address" in node.options, command
        assert node.valued["--progress"] == ["auto", "always", "never"]
    assert nodes["stratad ctl completion"].positional_choices == ["bash", "zsh", "fish"]
    assert "--durability" in nodes["stratad serve"].valued
    ctl = subcommands(build_parser())["ctl"]
    assert set(subcommands(ctl)) >= {"sessions", "checkpoints", "state", "completion", "token"}


CASES = [
    (["stratad", ""], {"serve", "ctl", "mcp", "keygen", "rotate-key"}),
    (["stratad", "ctl", "s"], {"sessions", "state", "stats"}),
    (["stratad", "ctl", "--address", "unix:/x", "sessions", ""], {"ls", "show", "rm", "watch"}),
    (["stratad", "ctl", "checkpoints", ""], {"ls", "show", "diff"}),
    (["stratad", "ctl", "sessions", "ls", "--js"], {"--json"}),
    (["stratad", "ctl", "sessions", "ls", "--progress", ""], {"auto", "always", "never"}),
    (["stratad", "ctl", "state", "get", "s", "--decode", ""], {"langgraph"}),
    (["stratad", "ctl", "completion", ""], {"bash", "zsh", "fish"}),
    (["stratad", "serve", "--data"], {"--data-dir"}),
]


def write_script(tmp_path: Path, shell: str) -> Path:
    path = tmp_path / f"stratad.{shell}"
    path.write_text(completion_script(shell, build_parser()))
    return path


@pytest.mark.parametrize(("words", "expected"), CASES)
def test_bash_completes(tmp_path: Path, words: list[str], expected: set[str]) -> None:
    script = write_script(tmp_path, "bash")
    array = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _stratad; "
        "printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    assert set(out.stdout.split()) == expected


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
@pytest.mark.parametrize(("words", "expected"), CASES)
def test_fish_completes(tmp_path: Path, words: list[str], expected: set[str]) -> None:
    script = write_script(tmp_path, "fish")
    line = " ".join(words)
    program = f"source {script}; complete -C '{line}'"
    out = subprocess.run(["fish", "-c", program], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    assert {row.split("\t")[0] for row in out.stdout.splitlines()} == expected


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
@pytest.mark.parametrize(("words", "expected"), CASES)
def test_zsh_completes(tmp_path: Path, words: list[str], expected: set[str]) -> None:
    """compadd filters candidates by the typed prefix itself: the stub does the same."""
    script = write_script(tmp_path, "zsh")
    array = " ".join(f"'{w}'" for w in words)
    program = f"""
        compdef() {{ : }}
        _files() {{ : }}
        compadd() {{
            [[ $1 == -- ]] && shift
            local c; for c; do [[ $c == "$PREFIX"* ]] && print -r -- $c; done
        }}
        source {script}
        words=({array}); CURRENT={len(words)}; PREFIX=${{words[CURRENT]}}
        _stratad
        true
    """
    out = subprocess.run(["zsh", "-c", program], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    assert set(out.stdout.split()) == expected


def test_completion_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    from stratad.cli import main

    assert main(["ctl", "completion", "bash"]) == 0
    assert "complete -F _stratad stratad" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["ctl", "completion", "tcsh"])


def test_decoding_a_langgraph_payload_that_names_a_callable_never_calls_it(tmp_path: Path) -> None:
    """ctl decodes what any agent saved: a payload naming os.mkdir (LangGraph's default
    serializer would call it) decodes to its arguments, and nothing is created."""
    import ormsgpack

    target = tmp_path / "made-by-a-payload"
    call = ormsgpack.Ext(1, ormsgpack.packb(["os", "mkdir", [str(target)]]))  # a constructor
    envelope = {"checkpoint": {"v": 4, "id": "x", "channel_values": {"evil": call}}}
    content_type = decode.LANGGRAPH_CONTENT_TYPE_PREFIX + "msgpack"
    decoded = decode.decode(ormsgpack.packb(envelope), content_type, "langgraph")
    assert decoded.value["checkpoint"]["channel_values"] == {"evil": [str(target)]}
    assert not target.exists()


def test_a_pickled_langgraph_checkpoint_is_refused_not_unpickled() -> None:
    with pytest.raises(decode.DecodeError, match="never unpickles"):
        decode.decode(b"\x80\x04K\x01.", decode.LANGGRAPH_CONTENT_TYPE_PREFIX + "pickle")
