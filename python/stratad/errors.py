"""The one exception hierarchy of stratad.

Every error the daemon, the SDK or the native core can raise is a subclass of
:class:`StratadError`. Each class names the gRPC status code it maps to (as a
string, so this module does not import grpc); the server's error interceptor
turns an exception into that status, and the client SDK turns the status back
into the same exception class. The native extension (`stratad._core`) raises
these classes too: `native.py` hands them to the extension at import time.
"""

from __future__ import annotations


class StratadError(Exception):
    """Base class of every stratad error. Unknown errors map to INTERNAL."""

    grpc_status: str = "INTERNAL"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(StratadError):
    """Malformed input: a bad ID, a missing field, a value out of range."""

    grpc_status = "INVALID_ARGUMENT"


class NotFoundError(StratadError):
    """The resource does not exist (or belongs to another tenant)."""

    grpc_status = "NOT_FOUND"


class AlreadyExistsError(StratadError):
    """A resource with that ID exists already, or an immutable layer is already set."""

    grpc_status = "ALREADY_EXISTS"


class FailedPreconditionError(StratadError):
    """The resource is not in the state the operation requires."""

    grpc_status = "FAILED_PRECONDITION"


class VersionConflictError(StratadError):
    """`expected_version` did not match the session's current version."""

    grpc_status = "ABORTED"


class ResourceExhaustedError(StratadError):
    """A quota, a message-size limit or the disk is full."""

    grpc_status = "RESOURCE_EXHAUSTED"


class DecompressionLimitError(ResourceExhaustedError):
    """Decompressing would produce more bytes than the caller allowed."""


class DataLossError(StratadError):
    """Stored bytes failed their checksum: stratad never returns wrong data."""

    grpc_status = "DATA_LOSS"


class CorruptObjectError(DataLossError):
    """A framed object failed to decode: bad magic, bad header, bad payload or digest mismatch."""


class UnauthenticatedError(StratadError):
    grpc_status = "UNAUTHENTICATED"


class PermissionDeniedError(StratadError):
    grpc_status = "PERMISSION_DENIED"


class UnavailableError(StratadError):
    """The daemon is shutting down or cannot be reached."""

    grpc_status = "UNAVAILABLE"


class DeadlineExceededError(StratadError):
    grpc_status = "DEADLINE_EXCEEDED"


class InternalError(StratadError):
    grpc_status = "INTERNAL"


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
]
