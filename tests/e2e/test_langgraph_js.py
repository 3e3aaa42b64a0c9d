"""@stratad/langgraph (clients/langgraph-js), the LangGraph.js checkpointer, against real daemons.

Installs the package and the examples as clients/langgraph-js/scripts/deps.sh
does (``npm ci`` when a lockfile changed, then tsc), then:

- runs LangGraph's official validation suite
  (@langchain/langgraph-checkpoint-validation: put, putWrites, getTuple, list,
  deleteThread, plus the opt-in getDeltaChannelHistory scenarios) and the
  package's own vitest suites against a daemon, and requires every test to pass;
- kills a StateGraph run (examples/langgraphjs/resume.mjs) with SIGKILL mid-way
  and checks that a new node process continues from the last checkpoint;
- runs the human-in-the-loop example (examples/langgraphjs/interrupt.mjs):
  one process interrupts, a later one answers with Command({ resume });
- checks that the Python saver and the TypeScript one read each other's threads.

Skipped when node/npm are missing, unless STRATAD_REQUIRE_NODE is set (CI):
then it fails.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from node_toolchain import install, node_env

import stratad
from stratad.integrations.langgraph import StratadSaver, stratad_checkpoint_id

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "langgraph-js"
EXAMPLES = ROOT / "examples" / "langgraphjs"
DEPS_SCRIPT = PACKAGE / "scripts" / "deps.sh"
STEPS = 12
#: The suites of the validation package: `validate()`'s five and the opt-in delta one.
VALIDATION_SUITES = {"put", "putWrites", "getTuple", "list", "deleteThread"} | {
    "getDeltaChannelHistory"
}


@pytest.fixture(scope="module")
def lg_package() -> Path:
    """clients/langgraph-js and examples/langgraphjs installed (npm ci when stale) and built."""
    install(DEPS_SCRIPT, timeout=900)
    return PACKAGE


def run(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_package_type_checks(lg_package: Path) -> None:
    result = run(["npm", "run", "--silent", "typecheck"], lg_package, node_env())
    assert result.returncode == 0, result.stdout + result.stderr


def test_validation_suite_and_saver_suites_pass_against_a_daemon(
    lg_package: Path, daemon: Any, tmp_path: Path
) -> None:
    report = tmp_path / "vitest.json"
    result = run(
        ["npm", "run", "--silent", "test", "--", "--reporter=default", "--reporter=json",
         f"--outputFile.json={report}"],
        lg_package,
        node_env(STRATAD_ADDRESS=daemon.target),
        timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary = json.loads(report.read_text())
    # Nothing skipped, nothing left to do: every test of every suite ran and passed.
    assert summary["numFailedTests"] == 0, output
    assert summary["numPendingTests"] == 0 and summary["numTodoTests"] == 0, output
    assert summary["numPassedTests"] == summary["numTotalTests"], output

    per_suite: Counter[str] = Counter()
    per_file: Counter[str] = Counter()
    for file in summary["testResults"]:
        for test in file["assertionResults"]:
            assert test["status"] == "passed", test["fullName"]
            per_file[Path(file["name"]).name] += 1
            suite = next((t for t in test["ancestorTitles"] if "#" in t), "")
            if suite.startswith("@stratad/langgraph#"):
                per_suite[suite.split("#", 1)[1]] += 1
    print(f"vitest: {dict(per_file)}; validation suites: {dict(per_suite)}")
    assert set(per_suite) == VALIDATION_SUITES, per_suite
    # The suite's own size (1.1.1: 718 tests in validate(), 8 delta-channel ones):
    # a much smaller count would mean it stopped generating its list cases.
    assert per_suite["list"] >= 600 and sum(per_suite.values()) >= 700, per_suite
    assert per_file["saver.test.ts"] >= 13, per_file
    assert daemon.proc.poll() is None


def resume_cmd(thread: str) -> list[str]:
    return ["node", "resume.mjs", "--thread", thread, "--steps", str(STEPS), "--delay", "0.05"]


def test_killed_graph_resumes_from_the_sidecar_in_a_new_process(
    lg_package: Path, daemon: Any
) -> None:
    env = node_env(STRATAD_ADDRESS=daemon.target)
    first = subprocess.Popen(
        resume_cmd("report-1"), cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None
    done_first = []
    for line in first.stdout:
        if line.startswith("step "):
            done_first.append(int(line.split()[1]))
            if len(done_first) == 5:
                first.send_signal(signal.SIGKILL)
                break
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL, "the first run finished before it was killed"
    assert done_first == [0, 1, 2, 3, 4]

    second = run(resume_cmd("report-1"), EXAMPLES, env)
    assert second.returncode == 0, second.stdout + second.stderr
    lines = second.stdout.splitlines()
    resumed = [line for line in lines if line.startswith("resuming at")]
    assert resumed, lines
    kept = int(resumed[0].split()[2])
    # LangGraph's default durability ("async") may lose the step in flight at the kill.
    assert 3 <= kept <= 5, lines
    redone = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    assert redone == list(range(kept, STEPS)), lines
    assert lines[-1] == f"done: {STEPS} messages"

    # The Python saver reads the thread the TypeScript one wrote.
    with StratadSaver(daemon.target) as saver:
        latest = saver.get_tuple({"configurable": {"thread_id": "report-1"}})
        history = list(saver.list({"configurable": {"thread_id": "report-1"}}))
    assert latest is not None
    contents = [m.content for m in latest.checkpoint["channel_values"]["messages"]]
    assert contents == [f"section {i}" for i in range(STEPS)]
    # Every step's checkpoint once: the input (-1), START's (0), one per message.
    steps = sorted(t.metadata["step"] for t in history)
    assert steps == list(range(-1, STEPS + 1)), steps

    third = run(resume_cmd("report-1"), EXAMPLES, env)
    assert third.returncode == 0, third.stderr
    assert third.stdout.splitlines()[0] == "already finished"


def test_interrupt_is_answered_by_a_later_process(lg_package: Path, daemon: Any) -> None:
    env = node_env(STRATAD_ADDRESS=daemon.target, STRATAD_TENANT="support")
    asked = run(["node", "interrupt.mjs", "ask", "--thread", "refund-17"], EXAMPLES, env)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert asked.stdout.strip() == (
        'waiting for an answer: {"question":"Send this reply?","options":["yes","no"]}'
    )

    # Between the two processes the question is only in the sidecar: a session of
    # the tenant, its latest checkpoint carrying the interrupt as a pending write.
    with stratad.Client(daemon.target, tenant="support") as client:
        session = client.get_session("refund-17")
        assert dict(session.labels) == {
            "stratad.integration": "langgraph",
            "langgraph.thread_id": "refund-17",
        }
        head = client.load_state_with_writes("refund-17")
        assert head.content_type == "application/vnd.langgraph.checkpoint+json"
        assert head.data.startswith(b"SLG2\n")  # the Python saver's layout, JSON pieces
        assert [w.channel for w in head.checkpoint.pending_writes] == ["__interrupt__"]
        assert head.checkpoint.pending_writes[0].idx == -3  # WRITES_IDX_MAP[INTERRUPT]
    with StratadSaver(daemon.target, tenant="support") as saver:
        paused = saver.get_tuple({"configurable": {"thread_id": "refund-17"}})
    assert paused is not None
    [(_, channel, value)] = paused.pending_writes
    assert channel == "__interrupt__"
    assert value[0]["value"] == {"question": "Send this reply?", "options": ["yes", "no"]}

    answered = run(
        ["node", "interrupt.mjs", "answer", "--thread", "refund-17", "--answer", "yes"],
        EXAMPLES,
        env,
    )
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert answered.stdout.splitlines() == [
        'resuming refund-17 at approve with "yes"',
        "human: order 1234 arrived broken",
        'ai: Draft: refund approved for "order 1234 arrived broken".',
        "human: reviewer: yes",
        "ai: Reply sent.",
    ]
    shown = run(["node", "interrupt.mjs", "show", "--thread", "refund-17"], EXAMPLES, env)
    assert shown.returncode == 0, shown.stderr
    assert [line.split()[1] for line in shown.stdout.splitlines()] == ["3", "2", "1", "0", "-1"]

    again = run(["node", "interrupt.mjs", "answer", "--thread", "refund-17"], EXAMPLES, env)
    assert again.returncode == 1
    assert again.stdout.strip() == "thread refund-17 is not waiting for an answer"


class Review(TypedDict):
    messages: Annotated[list[Any], add_messages]
    tags: set[str]


def python_review_graph(saver: StratadSaver) -> Any:
    def draft(state: Review) -> dict[str, Any]:
        return {"messages": [{"role": "assistant", "content": "draft"}], "tags": {"a", "b"}}

    def review(state: Review) -> dict[str, Any]:
        answer = interrupt({"question": "ok?"})
        return {"messages": [{"role": "user", "content": answer}]}

    builder = StateGraph(Review)
    builder.add_node("draft", draft)
    builder.add_node("review", review)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


READ_THREAD = """
import { StratadSaver } from "@stratad/langgraph";
const saver = new StratadSaver();
const tuples = [];
for await (const t of saver.list({ configurable: { thread_id: process.argv[1] } })) tuples.push(t);
const latest = await saver.getTuple({ configurable: { thread_id: process.argv[1] } });
console.log(JSON.stringify({
  ids: tuples.map((t) => t.checkpoint.id),
  steps: tuples.map((t) => t.metadata.step),
  messages: latest.checkpoint.channel_values.messages.map((m) => [m.getType(), m.content]),
  tags: [...latest.checkpoint.channel_values.tags].sort(),
  writes: latest.pendingWrites.map(([, channel, value]) => [channel, value]),
  parent: latest.parentConfig.configurable.checkpoint_id,
}));
saver.close();
"""


def test_the_typescript_saver_reads_a_thread_the_python_saver_wrote(
    lg_package: Path, daemon: Any
) -> None:
    config: Any = {"configurable": {"thread_id": "py-review"}}
    with StratadSaver(daemon.target) as saver:
        python_review_graph(saver).invoke({"messages": [("user", "hi")], "tags": set()}, config)
        history = list(saver.list(config))
    result = run(
        ["node", "--input-type=module", "-e", READ_THREAD, "py-review"],
        lg_package,
        node_env(STRATAD_ADDRESS=daemon.target),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout)
    assert seen["ids"] == [t.config["configurable"]["checkpoint_id"] for t in history]
    assert seen["steps"] == [t.metadata["step"] for t in history]
    assert seen["messages"] == [["human", "hi"], ["ai", "draft"]]
    assert seen["tags"] == ["a", "b"]
    [(channel, value)] = seen["writes"]
    assert channel == "__interrupt__" and value[0]["value"] == {"question": "ok?"}
    assert seen["parent"] == history[1].config["configurable"]["checkpoint_id"]
    # The same stratad checkpoint IDs on both sides.
    with stratad.Client(daemon.target) as client:
        ids = [c.checkpoint_id for c in client.list_checkpoints("py-review")]
    assert ids == [stratad_checkpoint_id("py-review", "", i) for i in seen["ids"]]
