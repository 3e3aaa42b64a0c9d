"""The stratad command line, short of actually serving (see tests/e2e)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stratad import __version__
from stratad.cli import main
from stratad.config import OPTIONS


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out.strip() == f"stratad {__version__}"


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_serve_help_documents_every_option_env_var_and_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "2000")  # no wrapping inside values like stratad-data
    with pytest.raises(SystemExit) as excinfo:
        main(["serve", "--help"])
    assert excinfo.value.code == 0
    help_text = capsys.readouterr().out
    # One block per option: "  --flag METAVAR  help...", possibly over two lines.
    blocks = {b.split()[0]: " ".join(b.split()) for b in re.split(r"\n(?=  -)", help_text)}
    for option in OPTIONS:
        assert option.env_var in blocks[option.flag]
        assert f"default: {option.default})" in blocks[option.flag]
    assert "STRATAD_CONFIG" in help_text


def test_config_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--grace-period", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("stratad: config error:") and "grace_period" in err


def test_unknown_key_in_config_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "stratad.toml"
    path.write_text("colour = 'blue'\n")
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'colour'" in err


def test_environment_errors_are_config_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STRATAD_DURABILITY", "eventually")
    assert main(["serve"]) == 2
    assert "STRATAD_DURABILITY" in capsys.readouterr().err


def test_unknown_flag_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["serve", "--no-such-flag"])
    assert excinfo.value.code == 2
