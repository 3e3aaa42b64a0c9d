"""How the SDK's calls are made and how their failures are raised.

Owns what both `Client` and `AsyncClient` (and the other modules that open a
channel of their own, e.g. stratad.mcp) share about the transport: the channel
options (a service-config retry policy that retries calls failing with
UNAVAILABLE before they reach the daemon, with exponential backoff, and the
message size limits), and the mapping of a failed call to the `stratad.errors`
class of its status code, with the reason and metadata of the
`google.rpc.ErrorInfo` the daemon attaches.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from stratad.errors import ERROR_BY_STATUS, ERROR_DOMAIN, StratadError, UnavailableError
from stratad.sdk import diagnose

if TYPE_CHECKING:
    from stratad.sdk.connection import TLSConfig

__all__ = ["channel_options", "error_info", "not_ready_error", "to_error"]

_RETRY_POLICY = {
    "methodConfig": [
        {
            "name": [
                {"service": f"stratad.api.v1.{s}"}
                for s in (
                    "SessionService",
                    "CheckpointService",
                    "TaskService",
                    "CognitiveStateService",
                    "AgentStateService",
                    "ProfileService",
                    "CrystalService",
                    "AdminService",
                )
            ],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.05s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        },
        # A watch is not retried: a retried stream that had no event yet waits
        # on a daemon that is gone (it hung for good when the daemon was
        # SIGKILLed) instead of telling the caller, who resumes from the last
        # version seen (Client.watch_session, stratad ctl sessions watch).
        # The most specific name wins over the service-wide entry above.
        {"name": [{"service": "stratad.api.v1.SessionService", "method": "WatchSession"}]},
    ]
}


def channel_options(max_message_bytes: int = 64 << 20) -> list[tuple[str, Any]]:
    return [
        ("grpc.service_config", json.dumps(_RETRY_POLICY)),
        ("grpc.enable_retries", 1),
        ("grpc.max_send_message_length", max_message_bytes + (1 << 20)),
        ("grpc.max_receive_message_length", max_message_bytes + (1 << 20)),
    ]


def to_error(exc: grpc.RpcError) -> StratadError:
    """The stratad.errors exception for a failed call, with the server's reason.

    The reason and its metadata come from the `google.rpc.ErrorInfo` the
    daemon attaches to every error (`exc.reason`, e.g. "VERSION_CONFLICT");
    calls that carry none (a transport failure) get the class default.
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(code)
    cls = ERROR_BY_STATUS.get(code.name, StratadError)
    info = error_info(exc)
    if info is None:
        return cls(details)
    return cls(details, reason=info.reason, metadata=dict(info.metadata))


def error_info(exc: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The stratad ErrorInfo of a failed call, if the daemon sent one."""
    try:
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except (ValueError, AttributeError):  # a mismatched or malformed trailer
        return None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            return info
    return None


def not_ready_error(address: str, tls: TLSConfig | None) -> StratadError:
    """What `wait_ready` raises when the daemon did not accept a connection in
    time: UnavailableError naming the setting to change when a TLS mismatch is
    the cause (probes the address once, see stratad.sdk.diagnose), else a
    StratadError saying no daemon is reachable."""
    diagnosis = diagnose.diagnose_address(address, tls)
    if diagnosis is not None:
        return UnavailableError(
            diagnosis.message, reason=diagnosis.reason, metadata={"address": address}
        )
    return StratadError(f"no stratad daemon reachable at {address}")
