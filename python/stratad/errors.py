"""The one exception hierarchy of stratad.

Every error the daemon, the SDK or the native core can raise is a subclass of
:class:`StratadError`. Each class names the gRPC status code it maps to (as a
string, so this module does not import grpc); the server's error interceptor
turns an exception into that status, and the client SDK turns the status back
into the same exception class. The native extension (`stratad._core`) raises
these classes too: `native.py` hands them to the extension at import time.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The `google.rpc.ErrorInfo` domain of every reason stratad reports.
ERROR_DOMAIN = "stratad.dev"


class StratadError(Exception):
    """Base class of every stratad error. Unknown errors map to INTERNAL.

    ``reason`` is a stable, machine-readable UPPER_SNAKE_CASE word (the
    `google.rpc.ErrorInfo` reason, domain :data:`ERROR_DOMAIN`) that clients
    match instead of the English message; each class has a default and a raise
    site may name a more precise one (``VersionConflictError(msg,
    reason="VERSION_CONFLICT", metadata={"expected": "3", "actual": "4"})``).
    ``metadata`` carries the details as strings, as ErrorInfo requires.
    """

    grpc_status: str = "INTERNAL"
    default_reason: str = "INTERNAL"

    def __init__(
        self,
        message: str = "",
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgumentError(StratadError):
    """Malformed input: a bad ID, a missing field, a value out of range."""

    grpc_status = "INVALID_ARGUMENT"
    default_reason = "INVALID_ARGUMENT"


class NotFoundError(StratadError):
    """The resource does not exist (or belongs to another tenant)."""

    grpc_status = "NOT_FOUND"
    default_reason = "NOT_FOUND"


class AlreadyExistsError(StratadError):
    """A resource with that ID exists already, or an immutable layer is already set."""

    grpc_status = "ALREADY_EXISTS"
    default_reason = "ALREADY_EXISTS"


class FailedPreconditionError(StratadError):
    """The resource is not in the state the operation requires."""

    grpc_status = "FAILED_PRECONDITION"
    default_reason = "FAILED_PRECONDITION"


class VersionConflictError(StratadError):
    """`expected_version` did not match the session's current version."""

    grpc_status = "ABORTED"
    default_reason = "VERSION_CONFLICT"


class ResourceExhaustedError(StratadError):
    """A quota, a message-size limit or the disk is full."""

    grpc_status = "RESOURCE_EXHAUSTED"
    default_reason = "RESOURCE_EXHAUSTED"


class DecompressionLimitError(ResourceExhaustedError):
    """Decompressing would produce more bytes than the caller allowed."""

    default_reason = "DECOMPRESSION_LIMIT"


class DataLossError(StratadError):
    """Stored bytes failed their checksum: stratad never returns wrong data."""

    grpc_status = "DATA_LOSS"
    default_reason = "DATA_LOSS"


class CorruptObjectError(DataLossError):
    """A framed object failed to decode: bad magic, bad header, bad payload or digest mismatch."""

    default_reason = "CORRUPT_OBJECT"


class UnauthenticatedError(StratadError):
    grpc_status = "UNAUTHENTICATED"
    default_reason = "UNAUTHENTICATED"


class PermissionDeniedError(StratadError):
    grpc_status = "PERMISSION_DENIED"
    default_reason = "PERMISSION_DENIED"


class UnavailableError(StratadError):
    """The daemon is shutting down or cannot be reached."""

    grpc_status = "UNAVAILABLE"
    default_reason = "UNAVAILABLE"


class DeadlineExceededError(StratadError):
    grpc_status = "DEADLINE_EXCEEDED"
    default_reason = "DEADLINE_EXCEEDED"


class InternalError(StratadError):
    grpc_status = "INTERNAL"
    default_reason = "INTERNAL"


def session_not_found(session_id: str) -> NotFoundError:
    """A missing (or deleted) session, with the reason the clients match."""
    return NotFoundError(f"session {session_id!r} not found", reason="SESSION_NOT_FOUND")


def checkpoint_not_found(checkpoint_id: str) -> NotFoundError:
    """A missing checkpoint, with the reason the clients match."""
    return NotFoundError(f"checkpoint {checkpoint_id!r} not found", reason="CHECKPOINT_NOT_FOUND")


#: Status-code name -> exception class, used by the client SDK to map a gRPC
#: status back into this hierarchy. Subclasses that share a code (for example
#: CorruptObjectError) map to their most general class here.
ERROR_BY_STATUS: dict[str, type[StratadError]] = {
    cls.grpc_status: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        FailedPreconditionError,
        VersionConflictError,
        ResourceExhaustedError,
        DataLossError,
        UnauthenticatedError,
        PermissionDeniedError,
        UnavailableError,
        DeadlineExceededError,
        InternalError,
    )
}

__all__ = [
    "ERROR_BY_STATUS",
    "ERROR_DOMAIN",
    "AlreadyExistsError",
    "CorruptObjectError",
    "DataLossError",
    "DeadlineExceededError",
    "DecompressionLimitError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "StratadError",
    "UnauthenticatedError",
    "UnavailableError",
    "VersionConflictError",
    "checkpoint_not_found",
    "session_not_found",
]
