"""Every call runs the one way: servicers hand their domain work to the runner.

Where a call's work runs (the event loop or a worker thread) is decided by
server/runner.py alone, from the cost class the call declares. These checks
read the servicers' source and fail when a servicer decides it itself:

1. Every RPC of every registered service is an async method of a servicer
   module that reaches the runner (``self.calls.<entry>(...)``), directly or
   through the servicer's own helper methods.
2. No servicer calls the domain itself: no call on ``self.engine...`` or
   ``self.domain...`` (nor on a local name bound to one). Naming a command
   is fine (``self.calls.run(IO, self.engine.admin.verify, tenant)``), and
   so is calling the domain inside a nested function that is only ever
   handed to the runner (work and conversion run together on a thread).
3. No servicer module mentions what deciding involves: thresholds
   (``INLINE_*``), ``held_for_io``, locks, executors, threads, the
   committer, the fail-stop latch, the loop barrier, loop scheduling.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pool

import stratad.server.servicers as servicers_package
from stratad.server.registry import SERVICES

SERVICERS = Path(servicers_package.__file__).parent
MODULES = sorted(SERVICERS.glob("*.py"))
#: What only server/runner.py may touch.
FORBIDDEN = {
    "held_for_io",
    "lock",
    "Lock",
    "RLock",
    "threading",
    "concurrent",
    "executor",
    "run_in_executor",
    "to_thread",
    "run_coroutine_threadsafe",
    "call_soon_threadsafe",
    "get_running_loop",
    "get_event_loop",
    "committer",
    "answer_early",
    "fail_stop",
    "loop_barrier",
}
FORBIDDEN_PREFIXES = ("INLINE_",)
#: Attributes of a servicer that are (or lead to) the domain.
DOMAIN_ROOTS = {"engine", "domain"}
RUNNER = "calls"


def identifiers(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every name a module spells: names, attributes, imports, definitions, strings."""
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, ast.alias):
            yield line, node.name
            for part in node.name.split("."):
                yield line, part
            if node.asname:
                yield line, node.asname
        elif isinstance(node, ast.ImportFrom) and node.module:
            for part in node.module.split("."):
                yield line, part
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield line, node.name
        elif isinstance(node, ast.arg):
            yield line, node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield line, node.value  # getattr(x, "held_for_io")


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_no_servicer_module_decides_where_work_runs(module: Path) -> None:
    tree = ast.parse(module.read_text(), str(module))
    found = sorted(
        f"{module.name}:{line}: {name}"
        for line, name in identifiers(tree)
        if name in FORBIDDEN or name.startswith(FORBIDDEN_PREFIXES)
    )
    assert not found, "decided by server/runner.py only:\n" + "\n".join(found)


# -- the RPC methods ---------------------------------------------------------------------


def chain(node: ast.AST) -> list[str]:
    """``self.engine.checkpoints.save`` -> ["self", "engine", "checkpoints", "save"];
    [] for anything not rooted at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):  # self._replicator().status: rooted at a call
        return []
    if not isinstance(node, ast.Name):
        return []
    parts.append(node.id)
    return parts[::-1]


def parsed(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    return node


class MethodCheck(ast.NodeVisitor):
    """One method's body: its runner calls, helper calls and violations."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reaches_runner = False
        self.helpers: set[str] = set()
        self.violations: list[str] = []
        self.aliases: set[str] = set()  # local names bound to the domain
        self.closures: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.handed_to_runner: set[str] = set()
        self.closure_uses: list[ast.Name] = []
        self._in_closure = 0
        self._runner_args: set[int] = set()

    def domain_rooted(self, parts: list[str]) -> bool:
        if not parts:
            return False
        if parts[0] == "self":
            return len(parts) > 1 and parts[1] in DOMAIN_ROOTS
        return parts[0] in self.aliases

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.domain_rooted(chain(node.value)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.aliases.add(target.id)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._closure(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._closure(node)

    def _closure(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.closures[node.name] = node
        self._in_closure += 1
        self.generic_visit(node)
        self._in_closure -= 1

    def visit_Call(self, node: ast.Call) -> None:
        parts = chain(node.func)
        if parts[:2] == ["self", RUNNER]:
            self.reaches_runner = True
            for arg in node.args:
                if isinstance(arg, ast.Name):
                    self.handed_to_runner.add(arg.id)
                    self._runner_args.add(id(arg))
        elif len(parts) == 2 and parts[0] == "self" and parts[1] not in DOMAIN_ROOTS:
            self.helpers.add(parts[1])
        elif self.domain_rooted(parts) and not self._in_closure:
            self.violations.append(
                f"{self.name}:{node.lineno}: calls {'.'.join(parts)}() itself "
                "(hand it to self.calls)"
            )
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if id(node) not in self._runner_args:
            self.closure_uses.append(node)

    def finish(self) -> None:
        """Closures may call the domain only if nothing but the runner calls them."""
        for name in self.closures:
            if name not in self.handed_to_runner:
                self.violations.append(f"{self.name}: {name}() is not handed to self.calls")
            for use in self.closure_uses:
                if use.id == name:
                    self.violations.append(
                        f"{self.name}:{use.lineno}: {name} is used other than by self.calls"
                    )


def check(cls: type, name: str) -> MethodCheck:
    fn = getattr(cls, name)
    result = MethodCheck(f"{cls.__name__}.{name}")
    for statement in parsed(fn).body:
        result.visit(statement)
    result.finish()
    return result


def reaches_runner(cls: type, name: str, seen: set[str] | None = None) -> tuple[bool, list[str]]:
    """Does `name` reach the runner (itself or through helpers)? And every
    violation in it and the helpers it calls."""
    seen = set() if seen is None else seen
    seen.add(name)
    fn = getattr(cls, name)
    source = inspect.getsourcefile(fn)
    assert source is not None and Path(source).parent == SERVICERS, (
        f"{cls.__name__}.{name} is defined outside the servicers ({source})"
    )
    result = check(cls, name)
    reached, violations = result.reaches_runner, list(result.violations)
    for helper in sorted(result.helpers - seen):
        if not callable(getattr(cls, helper, None)):
            continue
        helper_reached, helper_violations = reaches_runner(cls, helper, seen)
        reached = reached or helper_reached
        violations += helper_violations
    return reached, violations


def rpcs() -> Iterator[tuple[type, str]]:
    pool = descriptor_pool.Default()
    for registration in SERVICES:
        service = pool.FindServiceByName(registration.name)
        cls = registration.servicer_factory
        assert isinstance(cls, type)
        for method in service.methods:
            yield cls, method.name


RPCS = list(rpcs())


def test_every_service_method_is_checked() -> None:
    assert len(RPCS) > 60, RPCS  # every registered service's RPCs, not an empty list
    assert len({cls for cls, _ in RPCS}) == len(SERVICES)


@pytest.mark.parametrize(("cls", "name"), RPCS, ids=[f"{c.__name__}.{n}" for c, n in RPCS])
def test_every_rpc_goes_through_the_runner(cls: type, name: str) -> None:
    fn = getattr(cls, name)
    assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), (
        f"{cls.__name__}.{name} is not an async method of a stratad servicer"
    )
    reached, violations = reaches_runner(cls, name)
    assert not violations, "\n".join(violations)
    assert reached, f"{cls.__name__}.{name} never hands its work to self.calls (the runner)"


# -- the checks catch what they are for --------------------------------------------------


class _Bad:
    async def Direct(self, request: Any, context: Any) -> Any:
        return self.engine.checkpoints.load_state("t", request.session_id)  # type: ignore[attr-defined]

    async def Aliased(self, request: Any, context: Any) -> Any:
        checkpoints = self.engine.checkpoints  # type: ignore[attr-defined]
        return await self.calls.run(None, checkpoints.find_missing(request.digests))  # type: ignore[attr-defined]

    async def Closure(self, request: Any, context: Any) -> Any:
        def load() -> Any:
            return self.domain.state("t", request.session_id)  # type: ignore[attr-defined]

        return load()

    async def Fine(self, request: Any, context: Any) -> Any:
        def load() -> Any:
            return self.domain.state("t", request.session_id)  # type: ignore[attr-defined]

        return await self.calls.run(None, load)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("Direct", "calls self.engine.checkpoints.load_state() itself"),
        ("Aliased", "calls checkpoints.find_missing() itself"),
        ("Closure", "load() is not handed to self.calls"),
    ],
)
def test_the_check_finds_domain_calls_outside_the_runner(name: str, complaint: str) -> None:
    violations = check(_Bad, name).violations
    assert any(complaint in v for v in violations), violations


def test_the_check_accepts_closures_handed_to_the_runner() -> None:
    result = check(_Bad, "Fine")
    assert result.violations == [] and result.reaches_runner


def test_the_name_check_finds_a_threshold_and_a_lock() -> None:
    source = "INLINE_X = 3\nwith live.lock:\n    pass\nif s.held_for_io(t): pass\n"
    names = {name for _, name in identifiers(ast.parse(source))}
    assert {"INLINE_X", "lock", "held_for_io"} <= names
