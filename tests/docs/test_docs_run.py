"""Docs that run: every code block of README.md, docs/ and the client READMEs
is run as written against a real daemon, or marked as not meant to be run
(tests/docs/docblocks.py says how each kind runs and how blocks are marked).

A page is one test: its blocks run in order, as a newcomer would follow it,
and a failure names the page and line of the block. The quick starts (README,
crystals) are run twice against the same daemon: a newcomer runs them again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from docblocks import PAGES, ROOT, Block, all_blocks, blocks
from go_toolchain import find_go
from grpc_health.v1 import health_pb2, health_pb2_grpc

DAEMON = "127.0.0.1:50051"
#: Pages whose runnable blocks run a second time: quick starts a newcomer
#: runs again must not fail on what the first run left (AlreadyExists, ...).
RUN_TWICE = {"README.md", "docs/crystals.md", "clients/ts/README.md"}
BLOCK_TIMEOUT = 600.0  # npm ci, go module downloads on a cold machine
VENV_BIN = ROOT / ".venv" / "bin"

# The driver of a page's Python blocks: one interpreter, one namespace.
PYTHON_DRIVER = r"""
import json, os, sys, traceback
# Blocks write to fds 1 and 2, pointed at each block's output file in turn (not
# sys.stdout swapped: a library may keep the sys.stderr it saw at import);
# the status of each block goes to a copy of the original stdout.
status_out = os.fdopen(os.dup(1), "w")
namespace = {"__name__": "__main__"}
for request in sys.stdin:
    block = json.loads(request)
    output = os.open(block["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    try:
        exec(compile(block["code"], block["where"], "exec"), namespace)
        status = "ok"
    except BaseException:
        traceback.print_exc()
        status = "error"
    sys.stdout.flush()
    sys.stderr.flush()
    print(status, file=status_out, flush=True)
"""


def test_every_block_is_run_or_marked() -> None:
    problems = [f"{block.where}: {block.problem()}" for block in all_blocks() if block.problem()]
    assert not problems, "\n".join(problems)


def test_most_blocks_run() -> None:
    """Marking is not a way out: a newcomer's pages are mostly runnable."""
    code = [b for b in all_blocks() if b.language != "text"]
    run = [b for b in code if b.runs]
    assert len(run) >= 0.6 * len(code), f"only {len(run)} of {len(code)} code blocks run"


def test_no_table_is_cut_by_a_blank_line() -> None:
    """A blank line ends a markdown table: the rows after it render as text."""
    cut = []
    for page in PAGES:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for number, (before, line, after) in enumerate(
            zip(lines, lines[1:], lines[2:], strict=False), 2
        ):
            if before.startswith("|") and not line.strip() and after.startswith("|"):
                cut.append(f"{page}:{number}")
    assert not cut, f"tables cut by a blank line at {cut}"


def test_the_readme_headline_figure_is_the_benchmarks_one() -> None:
    """Figures live in docs/benchmarks.md; the README's headline must match it."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    quoted = re.search(r"a ([\d,]+)-step conversation takes ([\d.]+) MB on disk", readme)
    assert quoted, "the README's headline figure moved: update this test"
    steps, megabytes = quoted[1].replace(",", ""), float(quoted[2])
    table = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    row = re.search(
        rf"^\| {steps} \| stratad \(gRPC, fsync\) \|[^|]*\|[^|]*\| ([\d.]+) MB \|", table, re.M
    )
    assert row, f"benchmarks.md has no {steps}-step row for stratad (gRPC, fsync)"
    assert round(float(row[1]), 1) == megabytes, (
        f"README says {megabytes} MB, benchmarks {row[1]} MB"
    )


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings (lowercase; punctuation dropped; spaces to -)."""
    anchors: set[str] = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # links in code are code
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, anchor = target.partition("#")
            file = (ROOT / page).parent / path if path else ROOT / page
            if not file.exists():
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def require_tools(runnable: list[Block]) -> None:
    """Skip a page whose blocks need a toolchain this machine lacks (fail where CI requires it)."""
    text = "\n".join(block.body for block in runnable)
    needs = {
        "node": (
            "STRATAD_REQUIRE_NODE",
            any(b.language == "js" for b in runnable)
            or re.search(r"\b(npm|node) ", text) is not None,
        ),
        "grpcurl": ("STRATAD_REQUIRE_GO", "grpcurl " in text),
    }
    for tool, (required_by, needed) in needs.items():
        found = shutil.which(tool, path=tools_path()) is not None
        if needed and not found:
            reason = f"{tool} is not installed (grpcurl: make go-tools)"
            if os.environ.get(required_by, "") not in ("", "0"):
                pytest.fail(f"{required_by} is set but {reason}", pytrace=False)
            pytest.skip(reason)
    if any(b.language == "go" for b in runnable) or re.search(r"\bgo (run|mod|list) ", text):
        find_go()  # skips, or fails under STRATAD_REQUIRE_GO


def tools_path() -> str:
    """PATH for the blocks: the venv (as if activated), Go, grpcurl (make go-tools)."""
    go_bin = str(Path(find_go()).parent)
    tools = subprocess.run(
        ["bash", str(ROOT / "scripts/go-tools.sh"), "bin"], capture_output=True, text=True
    ).stdout.strip()
    return os.pathsep.join([str(VENV_BIN), tools, go_bin, os.environ.get("PATH", "")])


class PageRun:
    """The blocks of one page, run in order in a scratch directory."""

    def __init__(self, page: str, workdir: Path) -> None:
        self.page = page
        self.workdir = workdir
        self.shell_state = workdir / ".docs-run-shell-state"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
        # STRATAD_SRC: the checkout, where install blocks say "your checkout".
        # CARGO_TARGET_DIR: an install from the checkout reuses its Rust build.
        self.env |= {
            "PATH": tools_path(),
            "STRATAD_SRC": str(ROOT),
            "GOFLAGS": "-modcacherw",
            "CARGO_TARGET_DIR": str(ROOT / "target"),
        }
        self.env.pop("VIRTUAL_ENV", None)
        self.daemon: subprocess.Popen[bytes] | None = None
        self.python: subprocess.Popen[str] | None = None
        self.counter = 0
        for entry in ROOT.iterdir():
            if entry.name not in {".git", "stratad-data"}:
                (workdir / entry.name).symlink_to(entry)

    # -- the daemon ----------------------------------------------------------

    def start_daemon(self, command: list[str], block: Block | None = None) -> None:
        """Start the page's daemon; a daemon block replaces the one started by default."""
        if self.daemon is not None:
            if block is None:
                return
            self.stop_daemon()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", 50051)) == 0:
                pytest.fail(f"{DAEMON} is already taken: stop the daemon there to run the docs")
        log = open(self.workdir / "daemon.log", "wb")  # noqa: SIM115 - closed with the page
        self.daemon = subprocess.Popen(
            command,
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300  # `make run` may still build on a cold machine
        with grpc.insecure_channel(DAEMON) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                with contextlib.suppress(grpc.RpcError):
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        return
                if self.daemon.poll() is not None or time.monotonic() > deadline:
                    where = block.where if block else self.page
                    pytest.fail(f"{where}: the daemon did not serve:\n{self.daemon_log()}")
                time.sleep(0.2)

    def daemon_log(self) -> str:
        return (self.workdir / "daemon.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.python is not None:
            self.python.kill()
            self.python.wait()
        self.stop_daemon()

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            os.killpg(self.daemon.pid, signal.SIGTERM)
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.daemon.pid, signal.SIGKILL)
                self.daemon.wait()
        self.daemon = None

    # -- blocks --------------------------------------------------------------

    def run(self, block: Block) -> None:
        if "daemon" in block.modifiers:  # with the variables earlier blocks set
            state = f"set -a; if [ -f {self.shell_state} ]; then . {self.shell_state}; fi; set +a\n"
            self.start_daemon(["bash", "-c", state + block.body], block)
            return
        self.start_daemon([str(VENV_BIN / "stratad"), "serve", "--data-dir", "stratad-data"])
        self.counter += 1
        runner = {
            "python": self.run_python,
            "sh": self.run_shell,
            "bash": self.run_shell,
            "console": self.run_console,
            "go": self.run_go,
            "js": self.run_js,
            "toml": self.run_toml,
        }[block.language]
        runner(block)

    def fail(self, block: Block, output: str) -> None:
        pytest.fail(
            f"{block.where} ({block.language}) failed:\n{block.body}\n--- output:\n"
            f"{output[-6000:]}\n--- daemon log (tail):\n{self.daemon_log()[-1500:]}",
            pytrace=False,
        )

    def run_python(self, block: Block) -> None:
        if self.python is None:
            self.python = subprocess.Popen(
                [str(VENV_BIN / "python"), "-c", PYTHON_DRIVER],
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        output = self.workdir / f"block{self.counter}.out"
        request = {"code": block.body, "where": block.where, "output": str(output)}
        assert self.python.stdin is not None and self.python.stdout is not None
        self.python.stdin.write(json.dumps(request) + "\n")
        self.python.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.python.stdout, selectors.EVENT_READ)
            if not selector.select(BLOCK_TIMEOUT):
                self.fail(block, f"still running after {BLOCK_TIMEOUT} s")
        status = self.python.stdout.readline().strip()
        if status != "ok":
            self.fail(block, output.read_text(errors="replace"))

    def shell(self, script: str, block: Block) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["bash", "-c", script],
                cwd=self.workdir,
                env=self.env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=BLOCK_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            self.fail(block, f"still running after {BLOCK_TIMEOUT} s:\n{exc.output}")
            raise

    def run_shell(self, block: Block) -> None:
        # Variables the page's earlier shell blocks set are kept (set -a exports
        # them; export -p saves them for the next block).
        state = self.shell_state
        script = (
            f"set -a; if [ -f {state} ]; then . {state}; fi\n"
            f"set -euo pipefail\n{block.body}\n"
            f"export -p | grep -v -E '^declare -x (PWD|OLDPWD|SHLVL|_)=' > {state}\n"
        )
        result = self.shell(script, block)
        if result.returncode != 0:
            self.fail(block, result.stdout)

    def run_console(self, block: Block) -> None:
        for command, expected in console_steps(block.body):
            result = self.shell(command, block)
            if not expected and result.returncode != 0:  # no output shown: it must succeed
                self.fail(block, f"$ {command}\nexit status {result.returncode}\n{result.stdout}")
            missing = [line for line in expected if not output_has(result.stdout, line)]
            if missing:
                self.fail(
                    block,
                    f"$ {command}\n{result.stdout}\n--- expected, not printed:\n"
                    + "\n".join(missing),
                )

    def run_go(self, block: Block) -> None:
        module = self.workdir / f"goblock{self.counter}"
        module.mkdir()
        (module / "main.go").write_text(block.body)
        client = "github.com/stratad/stratad/clients/go"
        script = (
            "set -euo pipefail\ngo mod init example.com/docsrun >/dev/null 2>&1\n"
            f"go mod edit -require={client}@v0.0.0 -replace={client}=$STRATAD_SRC/clients/go\n"
            "go mod tidy\ngo run .\n"
        )
        result = self.shell(f"cd {module}\n{script}", block)
        if result.returncode != 0:
            self.fail(block, result.stdout)

    def run_js(self, block: Block) -> None:
        script = self.workdir / f"block{self.counter}.mjs"
        script.write_text(block.body)
        result = self.shell(f"node {script}", block)
        if result.returncode != 0:
            self.fail(block, result.stdout)

    def run_toml(self, block: Block) -> None:
        config = self.workdir / f"block{self.counter}.toml"
        config.write_text(block.body)
        command = f"stratad serve --config {config} --check-config"
        if "auth-tokens" in block.modifiers:
            command = f"stratad serve --auth token --auth-tokens-file {config} --check-config"
        result = self.shell(command, block)
        if result.returncode != 0:
            self.fail(block, result.stdout)


def console_steps(body: str) -> Iterator[tuple[str, list[str]]]:
    """(command, expected output lines) of a console block's ``$`` lines."""
    command: list[str] = []
    expected: list[str] = []
    continuing = False
    for line in body.splitlines():
        if line.startswith("$ ") or continuing:
            if not continuing and command:
                yield "\n".join(command), expected
                command, expected = [], []
            text = line[2:] if line.startswith("$ ") and not continuing else line
            command.append(text)
            continuing = line.rstrip().endswith("\\")
        elif line.strip():
            expected.append(line.strip())
    if command:
        yield "\n".join(command), expected


def output_has(output: str, expected: str) -> bool:
    """Whether a line of ``output`` matches ``expected`` ('...' matches anything)."""
    pattern = ".*".join(re.escape(part.strip()) for part in expected.split("..."))
    return any(re.search(pattern, line) for line in output.splitlines())


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    runnable = [block for block in blocks(page) if block.runs]
    if not runnable:
        pytest.skip(f"{page} has no block to run")
    require_tools(runnable)
    run = PageRun(page, tmp_path)
    try:
        for block in runnable:
            run.run(block)
        if page in RUN_TWICE:
            for block in runnable:
                if "daemon" not in block.modifiers and block.language != "toml":
                    run.run(block)
    finally:
        run.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
