package stratad

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// statusError is the error a call returns when the daemon fails it with
// code, message and (when reason is not empty) a stratad ErrorInfo.
func statusError(t *testing.T, code codes.Code, msg, domain, reason string, meta map[string]string) error {
	t.Helper()
	st := status.New(code, msg)
	if reason != "" {
		var err error
		st, err = st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain, Metadata: meta})
		if err != nil {
			t.Fatal(err)
		}
	}
	return st.Err()
}

func TestErrorCarriesTheReasonAndMetadata(t *testing.T) {
	meta := map[string]string{"quota": "stored_bytes", "limit": "1048576"}
	err := toError(statusError(t, codes.ResourceExhausted, "over quota", ErrorDomain, "QUOTA_EXCEEDED", meta))
	e, ok := AsError(err)
	if !ok {
		t.Fatalf("got %T, want *Error", err)
	}
	if e.Code != codes.ResourceExhausted || e.Reason != ErrQuotaExceeded || e.Message != "over quota" {
		t.Fatalf("got %+v", e)
	}
	if e.Metadata["quota"] != "stored_bytes" || e.Metadata["limit"] != "1048576" {
		t.Fatalf("metadata: got %v", e.Metadata)
	}
	if got := e.Error(); got != "stratad: ResourceExhausted (QUOTA_EXCEEDED): over quota" {
		t.Fatalf("Error(): got %q", got)
	}
	// Still a gRPC status error for code that only knows grpc-go.
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("status.Code: got %v", status.Code(err))
	}
}

func TestErrorsIsMatchesTheReason(t *testing.T) {
	err := fmt.Errorf("saving: %w", toError(statusError(t, codes.Aborted, "at version 4", ErrorDomain, "VERSION_CONFLICT", nil)))
	if !errors.Is(err, ErrVersionConflict) {
		t.Fatal("a wrapped VERSION_CONFLICT must match ErrVersionConflict")
	}
	if errors.Is(err, ErrSessionNotFound) || errors.Is(err, ErrNotFound) {
		t.Fatal("VERSION_CONFLICT must not match other reasons")
	}
	if ReasonOf(err) != ErrVersionConflict {
		t.Fatalf("ReasonOf: got %q", ReasonOf(err))
	}
}

func TestCodeReasonsMatchEveryErrorOfTheirCode(t *testing.T) {
	err := toError(statusError(t, codes.NotFound, "no session", ErrorDomain, "SESSION_NOT_FOUND", nil))
	if !errors.Is(err, ErrSessionNotFound) || !errors.Is(err, ErrNotFound) {
		t.Fatal("SESSION_NOT_FOUND must match ErrSessionNotFound and ErrNotFound")
	}
	if errors.Is(err, ErrCheckpointNotFound) || errors.Is(err, ErrInvalidArgument) {
		t.Fatal("SESSION_NOT_FOUND must not match another reason or code")
	}
}

func TestErrorsWithoutErrorInfoHaveNoReason(t *testing.T) {
	// A transport failure, and a detail from another domain: no stratad reason.
	for _, raw := range []error{
		status.Error(codes.Unavailable, "connection refused"),
		statusError(t, codes.Unavailable, "proxy says no", "example.com", "UPSTREAM_DOWN", nil),
	} {
		err := toError(raw)
		e, ok := AsError(err)
		if !ok || e.Reason != "" || e.Code != codes.Unavailable {
			t.Fatalf("%v: got %+v", raw, e)
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v must match ErrUnavailable by its code", raw)
		}
	}
	if toError(nil) != nil {
		t.Fatal("toError(nil) must be nil")
	}
}
