package stratad

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stratadv1 "github.com/stratad/stratad/clients/go/stratadv1"
)

// flakySessions fails the first `failures` GetSession calls with `code`, then
// answers; it records the metadata of the last call. It stands in for a
// daemon restarting, which a test cannot make happen at a precise call.
type flakySessions struct {
	stratadv1.UnimplementedSessionServiceServer
	failures int32
	code     codes.Code
	calls    atomic.Int32
	lastMD   atomic.Pointer[metadata.MD]
}

func (f *flakySessions) GetSession(ctx context.Context, req *stratadv1.GetSessionRequest) (*stratadv1.GetSessionResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.lastMD.Store(&md)
	if f.calls.Add(1) <= f.failures {
		return nil, status.Error(f.code, "not now")
	}
	return &stratadv1.GetSessionResponse{Session: &stratadv1.Session{SessionId: req.GetSessionId()}}, nil
}

func serveFlaky(t *testing.T, f *flakySessions) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	stratadv1.RegisterSessionServiceServer(server, f)
	go server.Serve(lis)
	t.Cleanup(server.Stop)
	client, err := Dial(envOf(nil), WithAddress(lis.Addr().String()), WithTenant("acme"), WithToken("t0k"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func TestUnavailableIsRetried(t *testing.T) {
	f := &flakySessions{failures: 2, code: codes.Unavailable}
	client := serveFlaky(t, f)
	session, err := client.GetSession(context.Background(), "s1")
	if err != nil {
		t.Fatalf("two UNAVAILABLE answers then success: got %v", err)
	}
	if session.GetSessionId() != "s1" || f.calls.Load() != 3 {
		t.Fatalf("got session %q after %d calls, want s1 after 3", session.GetSessionId(), f.calls.Load())
	}
	md := *f.lastMD.Load()
	if got := md.Get(TenantHeader); len(got) != 1 || got[0] != "acme" {
		t.Fatalf("a retried call must carry the tenant: got %v", got)
	}
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer t0k" {
		t.Fatalf("a retried call must carry the token: got %v", got)
	}
}

func TestRetriesGiveUpAfterFiveAttempts(t *testing.T) {
	f := &flakySessions{failures: 100, code: codes.Unavailable}
	client := serveFlaky(t, f)
	_, err := client.GetSession(context.Background(), "s1")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("got %v, want UNAVAILABLE", err)
	}
	if f.calls.Load() != 5 {
		t.Fatalf("got %d attempts, want 5 (the retry policy's maxAttempts)", f.calls.Load())
	}
}

func TestOtherCodesAreNotRetried(t *testing.T) {
	f := &flakySessions{failures: 1, code: codes.Aborted}
	client := serveFlaky(t, f)
	_, err := client.GetSession(context.Background(), "s1")
	if e, ok := AsError(err); !ok || e.Code != codes.Aborted {
		t.Fatalf("got %v, want ABORTED", err)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("ABORTED was retried: %d calls", f.calls.Load())
	}
}
