"""The "agent" of the test pods: a small program using the stratad SDK.

It runs in the agent container of the pods tests/k8s creates, from the stratad
image itself (/opt/stratad/bin/python has the SDK), mounted from a ConfigMap at
/agent/k8s_agent.py. The tests also import it, for `make_state`.

    k8s_agent.py serve          the container's main process (below)
    k8s_agent.py CMD JSON       one command (kubectl exec); prints one JSON line

``serve`` does, in order:

1. its very first calls, over ``STRATAD_ADDRESS`` with no wait_ready and no
   retry: create the session ``AGENT_BOOT_SESSION`` (default ``boot``; kept if
   it exists) and save a state into it; then prints
   ``AGENT-BOOT {json}`` (``ok``, ``error``, ``checkpoint_id``, ``started_at``,
   ``acked_at``: this process's clock, the node's);
2. ``AGENT_START_COMMAND`` / ``AGENT_START_ARGS``: one more command as with
   exec, printed as ``AGENT-START {json}``;
3. waits for SIGTERM. With ``AGENT_FINAL_SESSION`` set, the handler first
   sleeps ``AGENT_FINAL_DELAY`` seconds (long enough that a sidecar stopped
   at the same time would already refuse calls), then creates that session
   and saves the state ``make_state(AGENT_FINAL_SESSION, "final",
   AGENT_FINAL_SIZE)`` into it, once each, with no retry; prints
   ``AGENT-FINAL {json}`` and exits 0 (1 if the save failed).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

TCP_ADDRESS = "127.0.0.1:50051"


def make_state(session: str, step: int | str, size: int = 4096) -> bytes:
    """Deterministic bytes for (session, step): a shared prefix (what dedup
    stores once) then bytes of their own, ``size`` in all."""
    shared = b"".join(hashlib.sha256(f"shared/{i}".encode()).digest() for i in range(32))
    own = bytearray()
    counter = 0
    while len(shared) + len(own) < size:
        own += hashlib.sha256(f"{session}/{step}/{counter}".encode()).digest()
        counter += 1
    return (shared + bytes(own))[:size]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _error(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "reason": str(getattr(exc, "reason", "")),
        "grpc_status": str(getattr(exc, "grpc_status", "")),
    }


def _client(address: str | None = None, **options: Any) -> Any:
    from stratad import Client

    return Client(address, timeout=20, **options)


# --- commands (each takes the JSON arguments, returns a JSON-able dict) ---------------


def cmd_addresses(args: dict[str, Any]) -> dict[str, Any]:
    """Save over each address and load it back over the other one."""
    addresses = [os.environ["STRATAD_ADDRESS"], TCP_ADDRESS]
    out: dict[str, Any] = {"addresses": addresses, "saves": []}
    for i, (saver, loader) in enumerate([addresses, addresses[::-1]]):
        session = f"{args.get('prefix', 'addr')}-{i}"
        data = make_state(session, 0, 2048)
        with _client(saver) as client:
            client.create_session(session, exist_ok=True)
            saved = client.save_state(session, data)
        with _client(loader) as client:
            loaded = client.load_state(session)
        out["saves"].append(
            {
                "saved_over": saver,
                "loaded_over": loader,
                "checkpoint_id": saved.checkpoint_id,
                "loaded_checkpoint_id": loaded.checkpoint_id,
                "same_bytes": bytes(loaded.data) == data,
            }
        )
    return out


def cmd_save(args: dict[str, Any]) -> dict[str, Any]:
    """Save ``checkpoints`` states of ``size`` bytes into each of ``sessions``
    (with ``only_new``, into those that do not exist yet: a restarted agent
    does not save them again)."""
    from stratad.errors import NotFoundError

    size = int(args.get("size", 4096))
    saved: list[dict[str, Any]] = []
    skipped: list[str] = []
    with _client(args.get("address")) as client:
        for session in args["sessions"]:
            if args.get("only_new"):
                try:
                    client.get_session(session)
                    skipped.append(session)
                    continue
                except NotFoundError:
                    pass
            client.create_session(session, exist_ok=True)
            for step in range(int(args.get("first", 0)), int(args.get("checkpoints", 1))):
                data = make_state(session, step, size)
                response = client.save_state(session, data, metadata={"step": step})
                saved.append(
                    {
                        "session": session,
                        "step": step,
                        "checkpoint_id": response.checkpoint_id,
                        "sha256": sha256(data),
                        "size": len(data),
                    }
                )
    return {"saved": saved, "skipped": skipped}


def cmd_load(args: dict[str, Any]) -> dict[str, Any]:
    """Every checkpoint of each of ``sessions``: ID, sha256 and size of its state."""
    out: dict[str, Any] = {}
    with _client(args.get("address")) as client:
        for session in args["sessions"]:
            try:
                checkpoints = list(client.list_checkpoints(session))
            except Exception as exc:
                out[session] = {"error": _error(exc)}
                continue
            loaded = []
            for checkpoint in reversed(checkpoints):  # oldest first
                state = client.load_state(session, checkpoint.checkpoint_id)
                data = bytes(state.data)
                loaded.append(
                    {
                        "checkpoint_id": checkpoint.checkpoint_id,
                        "sha256": sha256(data),
                        "size": len(data),
                    }
                )
            out[session] = {"checkpoints": loaded}
    return out


def cmd_resume(args: dict[str, Any]) -> dict[str, Any]:
    """Append one checkpoint to ``session`` (the session taken over from another
    pod): retried while another daemon's lease still holds it, up to ``timeout`` s."""
    from stratad.errors import FailedPreconditionError

    session, step = args["session"], args["step"]
    data = make_state(session, step, int(args.get("size", 4096)))
    deadline = time.monotonic() + float(args.get("timeout", 60))
    lease_held = 0
    with _client() as client:
        while True:
            try:
                response = client.save_state(session, data, metadata={"step": step})
                break
            except FailedPreconditionError as exc:
                if exc.reason != "LEASE_HELD" or time.monotonic() > deadline:
                    raise
                lease_held += 1
                time.sleep(0.5)
        head = client.get_session(session)
    return {
        "checkpoint_id": response.checkpoint_id,
        "sha256": sha256(data),
        "lease_held_retries": lease_held,
        "head": head.head_checkpoint_id,
    }


def cmd_auth(args: dict[str, Any]) -> dict[str, Any]:
    """With TLS and tokens on: what works and what is refused, over the socket
    (plaintext, STRATAD_ADDRESS) and over TLS on 127.0.0.1."""
    from stratad import TLSConfig

    tls = TLSConfig(ca_file=args["ca_file"], server_name=args.get("server_name", ""))
    token_file = os.environ.get("STRATAD_TOKEN_FILE", "")
    results: dict[str, Any] = {}

    def attempt(name: str, make: Callable[[], Any], session: str) -> None:
        data = make_state(session, 0, 1024)
        try:
            with make() as client:
                client.create_session(session, exist_ok=True)
                saved = client.save_state(session, data)
                loaded = client.load_state(session)
            results[name] = {
                "ok": True,
                "checkpoint_id": saved.checkpoint_id,
                "same_bytes": bytes(loaded.data) == data,
            }
        except Exception as exc:
            results[name] = {"ok": False, "error": _error(exc)}

    # The token comes from STRATAD_TOKEN_FILE, which the chart sets.
    attempt("socket_token", lambda: _client(), "auth-socket")
    attempt("tls_token", lambda: _client(TCP_ADDRESS, tls=tls), "auth-tls")
    # Without the token: hide the variable the SDK would read it from.
    os.environ.pop("STRATAD_TOKEN_FILE", None)
    attempt("socket_no_token", lambda: _client(), "auth-socket-anon")
    attempt("tls_no_token", lambda: _client(TCP_ADDRESS, tls=tls), "auth-tls-anon")
    attempt("tls_wrong_token", lambda: _client(TCP_ADDRESS, tls=tls, token="x" * 43), "auth-x")
    # The token, but plaintext on the TLS port.
    token = Path(token_file).read_text().strip() if token_file else ""
    attempt("plaintext_token", lambda: _client(TCP_ADDRESS, tls=False, token=token), "auth-plain")
    return results


def cmd_metrics(args: dict[str, Any]) -> dict[str, Any]:
    url = args.get("url", "http://127.0.0.1:9464/metrics")
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    wanted = set(args.get("names", []))
    lines = [ln for ln in text.splitlines() if ln.split("{")[0].split(" ")[0] in wanted]
    return {"status": response.status, "lines": lines}


COMMANDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "addresses": cmd_addresses,
    "save": cmd_save,
    "load": cmd_load,
    "resume": cmd_resume,
    "auth": cmd_auth,
    "metrics": cmd_metrics,
}


def _print(tag: str, payload: dict[str, Any]) -> None:
    print(f"{tag} {json.dumps(payload, sort_keys=True)}", flush=True)


def serve() -> int:
    started_at = time.time()
    session = os.environ.get("AGENT_BOOT_SESSION", "boot")
    boot: dict[str, Any] = {"started_at": started_at, "address": os.environ.get("STRATAD_ADDRESS")}
    # The very first call: no wait_ready, no retry. The native sidecar must
    # already be serving when this container starts.
    try:
        with _client() as client:
            data = make_state(session, "boot", 1024)
            client.create_session(session, exist_ok=True)
            saved = client.save_state(session, data)
        boot.update(ok=True, checkpoint_id=saved.checkpoint_id, sha256=sha256(data))
    except Exception as exc:
        boot.update(ok=False, error=_error(exc))
    boot["acked_at"] = time.time()
    _print("AGENT-BOOT", boot)

    command = os.environ.get("AGENT_START_COMMAND", "")
    if command:
        try:
            result = COMMANDS[command](json.loads(os.environ.get("AGENT_START_ARGS", "{}")))
            _print("AGENT-START", {"ok": True, "result": result})
        except Exception as exc:
            _print("AGENT-START", {"ok": False, "error": _error(exc)})

    stop: dict[str, int] = {}

    def on_sigterm(signum: int, _frame: object) -> None:
        stop["signum"] = signum

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    while "signum" not in stop:
        time.sleep(0.1)

    final_session = os.environ.get("AGENT_FINAL_SESSION", "")
    if not final_session:
        _print("AGENT-EXIT", {"at": time.time()})
        return 0
    received_at = time.time()
    time.sleep(float(os.environ.get("AGENT_FINAL_DELAY", "0")))
    final: dict[str, Any] = {"sigterm_at": received_at, "session": final_session}
    data = make_state(final_session, "final", int(os.environ.get("AGENT_FINAL_SIZE", "4096")))
    final["save_started_at"] = time.time()
    try:
        with _client() as client:
            client.create_session(final_session, exist_ok=True)
            saved = client.save_state(final_session, data, metadata={"final": True})
        final.update(ok=True, checkpoint_id=saved.checkpoint_id, sha256=sha256(data))
    except Exception as exc:
        final.update(ok=False, error=_error(exc))
    final["acked_at"] = time.time()
    _print("AGENT-FINAL", final)
    return 0 if final["ok"] else 1


def main(argv: list[str]) -> int:
    if argv[1:] == ["serve"]:
        return serve()
    if len(argv) == 3 and argv[1] in COMMANDS:
        print(json.dumps(COMMANDS[argv[1]](json.loads(argv[2])), sort_keys=True), flush=True)
        return 0
    print(f"usage: {argv[0]} serve | {{{'|'.join(COMMANDS)}}} JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
