package stratad

import (
	"errors"
	"fmt"
	"maps"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every reason stratad reports.
const ErrorDomain = "stratad.dev"

// A Reason is the machine-readable cause of a failed call: the reason of the
// google.rpc.ErrorInfo the daemon attaches to every error (docs/errors.md).
// Branch on reasons, never on messages:
//
//	if errors.Is(err, stratad.ErrVersionConflict) { ... }
//
// A Reason is an error so that errors.Is can match it against an *Error. The
// reasons named after a status code (ErrNotFound, ErrInvalidArgument,
// ErrUnavailable, ...) match every error of that code whatever its precise
// reason, so errors.Is(err, stratad.ErrNotFound) holds for SESSION_NOT_FOUND
// and CHECKPOINT_NOT_FOUND too; the others match their reason only.
// Reasons this list lacks still arrive in Error.Reason.
type Reason string

func (r Reason) Error() string { return "stratad: " + string(r) }

// Reasons named after their status code: each matches every error of the code.
const (
	ErrInvalidArgument    Reason = "INVALID_ARGUMENT"
	ErrNotFound           Reason = "NOT_FOUND"
	ErrAlreadyExists      Reason = "ALREADY_EXISTS"
	ErrFailedPrecondition Reason = "FAILED_PRECONDITION"
	ErrResourceExhausted  Reason = "RESOURCE_EXHAUSTED"
	ErrUnauthenticated    Reason = "UNAUTHENTICATED"
	ErrPermissionDenied   Reason = "PERMISSION_DENIED"
	ErrUnavailable        Reason = "UNAVAILABLE"
	ErrDeadlineExceeded   Reason = "DEADLINE_EXCEEDED"
	ErrDataLoss           Reason = "DATA_LOSS"
	ErrInternal           Reason = "INTERNAL"
)

// Precise reasons, grouped by the status code they come with.
const (
	// INVALID_ARGUMENT
	ErrInvalidID        Reason = "INVALID_ID"
	ErrInvalidValue     Reason = "INVALID_VALUE"
	ErrMalformedRequest Reason = "MALFORMED_REQUEST"
	ErrUploadMismatch   Reason = "UPLOAD_MISMATCH"
	ErrMessageTooLarge  Reason = "MESSAGE_TOO_LARGE"
	// NOT_FOUND
	ErrSessionNotFound    Reason = "SESSION_NOT_FOUND"
	ErrCheckpointNotFound Reason = "CHECKPOINT_NOT_FOUND"
	// FAILED_PRECONDITION
	ErrSessionNotPaused Reason = "SESSION_NOT_PAUSED"
	ErrNotInitialized   Reason = "NOT_INITIALIZED"
	ErrChunksMissing    Reason = "CHUNKS_MISSING"
	ErrLeaseHeld        Reason = "LEASE_HELD"
	ErrLeaseLost        Reason = "LEASE_LOST"
	ErrReplicationOff   Reason = "REPLICATION_OFF"
	ErrGCInProgress     Reason = "GC_IN_PROGRESS"
	// Encryption at rest: this daemon's master key cannot unwrap the
	// tenant's data key (metadata "key_id" names the key needed).
	ErrEncryptionKey Reason = "ENCRYPTION_KEY"
	// ABORTED: expected_version did not match; reload, then retry.
	ErrVersionConflict Reason = "VERSION_CONFLICT"
	// RESOURCE_EXHAUSTED
	ErrQuotaExceeded      Reason = "QUOTA_EXCEEDED"
	ErrDiskFull           Reason = "DISK_FULL"
	ErrOverloaded         Reason = "OVERLOADED"
	ErrReadOnly           Reason = "READ_ONLY"
	ErrWatcherTooSlow     Reason = "WATCHER_TOO_SLOW"
	ErrDecompressionLimit Reason = "DECOMPRESSION_LIMIT"
	// UNAVAILABLE
	ErrShuttingDown      Reason = "SHUTTING_DOWN"
	ErrStorageFailed     Reason = "STORAGE_FAILED"
	ErrJournalFailed     Reason = "JOURNAL_FAILED"
	ErrRemoteUnavailable Reason = "REMOTE_UNAVAILABLE"
	// DATA_LOSS
	ErrCorruptObject Reason = "CORRUPT_OBJECT"
	// UNAUTHENTICATED
	ErrMissingCredentials       Reason = "MISSING_CREDENTIALS"
	ErrInvalidToken             Reason = "INVALID_TOKEN"
	ErrUnknownClientCertificate Reason = "UNKNOWN_CLIENT_CERTIFICATE"
	// PERMISSION_DENIED
	ErrTenantMismatch    Reason = "TENANT_MISMATCH"
	ErrAdminRoleRequired Reason = "ADMIN_ROLE_REQUIRED"
)

// Reasons the client finds itself, with code UNAVAILABLE, when a connection
// fails because its TLS settings and the daemon's differ (docs/security.md,
// "Troubleshooting connection errors"); the message names the fix.
const (
	// ErrTLSRequired: the daemon speaks TLS, the client connected in plaintext.
	ErrTLSRequired Reason = "TLS_REQUIRED"
	// ErrClientCertRequired: the daemon requires a client certificate (mTLS)
	// and the client presented none.
	ErrClientCertRequired Reason = "CLIENT_CERT_REQUIRED"
	// ErrTLSNotSupported: the client connected with TLS to a plaintext daemon.
	ErrTLSNotSupported Reason = "TLS_NOT_SUPPORTED"
)

// codeReasons are the reasons that stand for every error of their code.
var codeReasons = map[Reason]codes.Code{
	ErrInvalidArgument:    codes.InvalidArgument,
	ErrNotFound:           codes.NotFound,
	ErrAlreadyExists:      codes.AlreadyExists,
	ErrFailedPrecondition: codes.FailedPrecondition,
	ErrResourceExhausted:  codes.ResourceExhausted,
	ErrUnauthenticated:    codes.Unauthenticated,
	ErrPermissionDenied:   codes.PermissionDenied,
	ErrUnavailable:        codes.Unavailable,
	ErrDeadlineExceeded:   codes.DeadlineExceeded,
	ErrDataLoss:           codes.DataLoss,
	ErrInternal:           codes.Internal,
}

// Error is a failed call: its status code and message, and the reason and
// metadata of the daemon's ErrorInfo. Reason is empty when the failure never
// reached the daemon (a refused connection, an expired deadline). status.Code
// and status.FromError work on it as on any gRPC error.
type Error struct {
	Code     codes.Code
	Message  string
	Reason   Reason
	Metadata map[string]string
	status   *status.Status
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("stratad: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("stratad: %s (%s): %s", e.Code, string(e.Reason), e.Message)
}

// Is reports whether target is e's reason, or a reason named after e's code.
func (e *Error) Is(target error) bool {
	reason, ok := target.(Reason)
	if !ok {
		return false
	}
	if reason == e.Reason {
		return true
	}
	code, byCode := codeReasons[reason]
	return byCode && code == e.Code
}

// GRPCStatus returns the status the call failed with (details included).
func (e *Error) GRPCStatus() *status.Status { return e.status }

// AsError returns err's *Error when err is (or wraps) one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// ReasonOf returns the reason of err: the daemon's ErrorInfo reason, "" when
// err is nil, not a call's error, or carries none.
func ReasonOf(err error) Reason {
	if e, ok := AsError(err); ok {
		return e.Reason
	}
	return ""
}

// toError turns a failed call's error into an *Error; nil stays nil, and
// errors that are no gRPC status (none should be) are returned as they are.
func toError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*Error); ok {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	if info := errorInfo(st); info != nil {
		e.Reason = Reason(info.GetReason())
		e.Metadata = maps.Clone(info.GetMetadata())
	}
	return e
}

// errorInfo returns the stratad ErrorInfo among the status details, if any.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info
		}
	}
	return nil
}
