package stratad

// Tests against a real stratad daemon. tests/e2e/test_client_go.py starts the
// daemons and runs `go test` with these variables set; without them the tests
// skip, unless STRATAD_TEST_REQUIRE_DAEMON=1 (then they fail).
//
//	STRATAD_TEST_ADDRESS        a daemon with auth off, plaintext
//	STRATAD_TEST_MAX_MESSAGE_BYTES  that daemon's max_message_bytes
//	STRATAD_TEST_AUTH_ADDRESS   a daemon with TLS and auth = "token"
//	STRATAD_TEST_AUTH_CA        the CA file its certificate chains to
//	STRATAD_TEST_AGENT_TOKEN    a token of role agent in tenant "acme"
//	STRATAD_TEST_ADMIN_TOKEN    a token of role admin

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	stratadv1 "github.com/stratad/stratad/clients/go/stratadv1"
)

// testEnv returns a test variable, skipping (or failing) the test when unset.
func testEnv(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		if os.Getenv("STRATAD_TEST_REQUIRE_DAEMON") == "1" {
			t.Fatalf("%s is not set (STRATAD_TEST_REQUIRE_DAEMON=1)", name)
		}
		t.Skipf("%s is not set: no daemon to test against (tests/e2e/test_client_go.py sets it)", name)
	}
	return value
}

// unique returns prefix plus a random suffix: IDs no earlier run used.
func unique(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// connect makes a Client for the plaintext daemon; the environment is ignored.
func connect(t *testing.T, opts ...Option) *Client {
	t.Helper()
	address := testEnv(t, "STRATAD_TEST_ADDRESS")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := []Option{envOf(nil), WithAddress(address)}
	client, err := New(ctx, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// must(call(...))(t) is the result of a call, failing the test on its error.
func must[T any](value T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return value
	}
}

func TestSaveLoadListAndFork(t *testing.T) {
	ctx := context.Background()
	client := connect(t, WithTenant(unique("tenant")))
	id := unique("chat")
	session := must(client.CreateSession(ctx, id, &SessionOptions{Labels: map[string]string{"app": "go-test"}, KeepLast: 10}))(t)
	if session.GetSessionId() != id || session.GetLabels()["app"] != "go-test" || session.GetRetention().GetKeepLast() != 10 {
		t.Fatalf("created: %v", session)
	}

	first := must(client.SaveState(ctx, id, []byte(`{"step": 1}`), &SaveOptions{
		ContentType: "application/json", Metadata: map[string]any{"step": 1, "source": "go"},
	}))(t)
	second := must(client.SaveState(ctx, id, []byte(`{"step": 2}`), &SaveOptions{ExpectedVersion: first.GetVersion()}))(t)
	if second.GetVersion() <= first.GetVersion() || second.GetSize() != uint64(len(`{"step": 2}`)) || len(second.GetDigest()) != 64 {
		t.Fatalf("second save: %v (first %v)", second, first)
	}

	latest := must(client.LoadState(ctx, id, nil))(t)
	if string(latest.GetData()) != `{"step": 2}` || latest.GetCheckpointId() != second.GetCheckpointId() {
		t.Fatalf("latest: %v", latest)
	}
	older := must(client.LoadState(ctx, id, &LoadOptions{CheckpointID: first.GetCheckpointId()}))(t)
	if string(older.GetData()) != `{"step": 1}` || older.GetContentType() != "application/json" {
		t.Fatalf("first checkpoint: %v", older)
	}
	if older.GetMetadata().GetFields()["source"].GetStringValue() != "go" {
		t.Fatalf("metadata: %v", older.GetMetadata())
	}

	checkpoints := must(client.ListCheckpoints(ctx, id, nil))(t)
	ids := []string{}
	for _, c := range checkpoints {
		ids = append(ids, c.GetCheckpointId())
	}
	if !slices.Equal(ids, []string{second.GetCheckpointId(), first.GetCheckpointId()}) {
		t.Fatalf("checkpoints newest first: got %v", ids)
	}
	filtered := must(client.ListCheckpoints(ctx, id, &ListCheckpointsOptions{MetadataFilter: map[string]any{"source": "go"}}))(t)
	if len(filtered) != 1 || filtered[0].GetCheckpointId() != first.GetCheckpointId() {
		t.Fatalf("metadata filter: got %v", filtered)
	}

	forkID := id + "-fork"
	fork := must(client.ForkSession(ctx, first.GetCheckpointId(), forkID, nil))(t)
	if fork.GetForkedFromCheckpointId() != first.GetCheckpointId() {
		t.Fatalf("fork: %v", fork)
	}
	forked := must(client.LoadState(ctx, forkID, nil))(t)
	if string(forked.GetData()) != `{"step": 1}` {
		t.Fatalf("fork's state: %q", forked.GetData())
	}

	listed := must(client.ListSessions(ctx, id))(t)
	names := []string{}
	for _, s := range listed {
		names = append(names, s.GetSessionId())
	}
	if !slices.Equal(names, []string{id, forkID}) {
		t.Fatalf("sessions with prefix %s: got %v", id, names)
	}

	must(client.CreateCheckpoint(ctx, id, "before-delete"))(t)
	restored := must(client.RestoreCheckpoint(ctx, first.GetCheckpointId(), true))(t)
	if string(restored.GetData()) != `{"step": 1}` {
		t.Fatalf("restored: %q", restored.GetData())
	}
	if got := must(client.GetSession(ctx, id))(t).GetHeadCheckpointId(); got != first.GetCheckpointId() {
		t.Fatalf("head after restore with make_current: %s", got)
	}
	if err := client.DeleteSession(ctx, forkID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetSession(ctx, forkID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted session: got %v", err)
	}
}

func TestListFollowsPages(t *testing.T) {
	ctx := context.Background()
	client := connect(t, WithTenant(unique("tenant")))
	id := unique("paged")
	must(client.CreateSession(ctx, id, nil))(t)
	for i := range pageSize + 5 {
		must(client.SaveState(ctx, id, []byte{byte(i)}, nil))(t)
	}
	checkpoints := must(client.ListCheckpoints(ctx, id, nil))(t)
	if len(checkpoints) != pageSize+5 {
		t.Fatalf("got %d checkpoints, want %d", len(checkpoints), pageSize+5)
	}
}

func TestVersionConflictIsATypedError(t *testing.T) {
	ctx := context.Background()
	client := connect(t)
	id := unique("conflict")
	must(client.CreateSession(ctx, id, nil))(t)
	saved := must(client.SaveState(ctx, id, []byte("v1"), nil))(t)

	_, err := client.SaveState(ctx, id, []byte("stale"), &SaveOptions{ExpectedVersion: saved.GetVersion() + 7})
	if !errors.Is(err, ErrVersionConflict) {
		t.Fatalf("got %v, want VERSION_CONFLICT", err)
	}
	e, _ := AsError(err)
	if e.Code != codes.Aborted || e.Reason != ErrVersionConflict || e.Message == "" {
		t.Fatalf("got %+v", e)
	}
	// The refused save changed nothing.
	loaded := must(client.LoadState(ctx, id, nil))(t)
	if string(loaded.GetData()) != "v1" || loaded.GetVersion() != saved.GetVersion() {
		t.Fatalf("after the refused save: %q at version %d", loaded.GetData(), loaded.GetVersion())
	}
}

func TestNotFoundAndInvalidArgumentAreTypedErrors(t *testing.T) {
	ctx := context.Background()
	client := connect(t)
	_, err := client.GetSession(ctx, unique("missing"))
	e, ok := AsError(err)
	if !ok || !errors.Is(err, ErrNotFound) || e.Code != codes.NotFound || e.Reason == "" {
		t.Fatalf("missing session: got %#v", err)
	}
	// The documented reasons are the ones the daemon sends.
	if !errors.Is(err, ErrSessionNotFound) || errors.Is(err, ErrCheckpointNotFound) {
		t.Fatalf("missing session: reason %q, want SESSION_NOT_FOUND", e.Reason)
	}
	id := unique("present")
	must(client.CreateSession(ctx, id, nil))(t)
	_, err = client.LoadState(ctx, id, &LoadOptions{CheckpointID: unique("no-checkpoint")})
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, ErrCheckpointNotFound) {
		t.Fatalf("missing checkpoint: got %v", err)
	}
	_, err = client.LoadState(ctx, id, nil)
	if !errors.Is(err, ErrCheckpointNotFound) {
		t.Fatalf("a session without a saved state: got %v", err)
	}
	_, err = client.CreateSession(ctx, id, nil)
	if !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("taken ID: got %v", err)
	}
	_, err = client.CreateSession(ctx, "not a valid id!", nil)
	if e, ok := AsError(err); !ok || e.Code != codes.InvalidArgument || e.Reason == "" || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("invalid ID: got %v", err)
	}
	if !errors.Is(err, ErrInvalidID) {
		t.Fatalf("invalid ID: reason of %v, want INVALID_ID", err)
	}
}

func TestStateAboveTheDaemonsLimitIsRefusedAndNothingStored(t *testing.T) {
	ctx := context.Background()
	limit, err := strconv.Atoi(testEnv(t, "STRATAD_TEST_MAX_MESSAGE_BYTES"))
	if err != nil {
		t.Fatal(err)
	}
	client := connect(t, WithMaxMessageBytes(limit))
	id := unique("big")
	must(client.CreateSession(ctx, id, nil))(t)
	saved := must(client.SaveState(ctx, id, bytes.Repeat([]byte("x"), limit), nil))(t)

	_, err = client.SaveState(ctx, id, bytes.Repeat([]byte("y"), limit+1), nil)
	if !errors.Is(err, ErrResourceExhausted) || ReasonOf(err) == "" {
		t.Fatalf("a state of limit+1 bytes: got %v, want the daemon's RESOURCE_EXHAUSTED", err)
	}
	session := must(client.GetSession(ctx, id))(t)
	if session.GetVersion() != saved.GetVersion() || session.GetCheckpointCount() != 1 {
		t.Fatalf("the refused save changed the session: %v", session)
	}
}

func TestRawStubsCarryTenantAndTypedErrors(t *testing.T) {
	ctx := context.Background()
	tenant := unique("tenant")
	client := connect(t, WithTenant(tenant))
	id := unique("raw")
	_, err := client.SessionService.CreateSession(ctx, &stratadv1.CreateSessionRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	// The stub's call acted in the client's tenant: the typed method finds it there.
	if _, err := client.GetSession(ctx, id); err != nil {
		t.Fatalf("session created through the raw stub: %v", err)
	}
	_, err = client.CheckpointService.LoadState(ctx, &stratadv1.LoadStateRequest{SessionId: unique("missing")})
	if _, ok := AsError(err); !ok || !errors.Is(err, ErrNotFound) {
		t.Fatalf("raw stub error: got %T %v", err, err)
	}
}

func TestStreamErrorsAreTyped(t *testing.T) {
	client := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client.SessionService.WatchSession(ctx, &stratadv1.WatchSessionRequest{SessionId: unique("missing")})
	if err == nil {
		_, err = stream.Recv()
	}
	if errors.Is(err, io.EOF) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("watching a missing session: got %v", err)
	}
}

func TestWatchSessionReplaysThenFollows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := connect(t)
	id := unique("watched")
	created := must(client.CreateSession(ctx, id, nil))(t)
	first := must(client.SaveState(ctx, id, []byte("1"), nil))(t)

	var events []*stratadv1.SessionEvent
	for event, err := range client.WatchSession(ctx, id, created.GetVersion()) {
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, event)
		if len(events) == 1 {
			// Replayed: the save after the creation. Now a new mutation, seen live.
			must(client.SaveState(ctx, id, []byte("2"), nil))(t)
		}
		if len(events) == 2 {
			break
		}
	}
	if len(events) != 2 || events[0].GetCheckpointId() != first.GetCheckpointId() ||
		events[1].GetVersion() <= first.GetVersion() || events[1].GetKind() != events[0].GetKind() {
		t.Fatalf("events: %v", events)
	}
	var errs []error
	for _, err := range client.WatchSession(ctx, unique("missing"), 0) {
		errs = append(errs, err)
	}
	if len(errs) != 1 || !errors.Is(errs[0], ErrNotFound) {
		t.Fatalf("watching a missing session: got %v, want one NOT_FOUND", errs)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	ctx := context.Background()
	a := connect(t, WithTenant(unique("a")))
	b := connect(t, WithTenant(unique("b")))
	id := unique("private")
	must(a.CreateSession(ctx, id, nil))(t)
	must(a.SaveState(ctx, id, []byte("a's secret"), nil))(t)

	if _, err := b.LoadState(ctx, id, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("tenant b loading tenant a's session: got %v", err)
	}
	if sessions := must(b.ListSessions(ctx, ""))(t); len(sessions) != 0 {
		t.Fatalf("tenant b sees %d sessions", len(sessions))
	}
	// The same ID is free in tenant b, and its state is b's own.
	must(b.CreateSession(ctx, id, nil))(t)
	must(b.SaveState(ctx, id, []byte("b's state"), nil))(t)
	if got := must(a.LoadState(ctx, id, nil))(t).GetData(); !bytes.Equal(got, []byte("a's secret")) {
		t.Fatalf("tenant a's state after b's save: %q", got)
	}
}

func TestDefaultDeadlineAppliesWhenTheContextHasNone(t *testing.T) {
	ctx := context.Background()
	client := connect(t, WithTimeout(time.Nanosecond))
	_, err := client.ListSessions(ctx, "")
	if !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("a 1ns default deadline: got %v", err)
	}
	// A deadline of the caller's own wins over the default.
	own, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := client.ListSessions(own, ""); err != nil {
		t.Fatalf("with the caller's deadline: %v", err)
	}
}

func TestReflectionV1ListsTheServices(t *testing.T) {
	client := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(client.Conn()).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	request := &reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: ""},
	}
	if err := stream.Send(request); err != nil {
		t.Fatal(err)
	}
	response, err := stream.Recv()
	if err != nil {
		t.Fatalf("grpc.reflection.v1: %v", err)
	}
	names := []string{}
	for _, s := range response.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"stratad.api.v1.SessionService", "stratad.api.v1.CheckpointService", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Fatalf("reflection v1 lists %v, not %s", names, want)
		}
	}
}

func TestNewFailsFastWithoutADaemon(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := New(ctx, envOf(nil), WithAddress("unix:"+filepath.Join(t.TempDir(), "no-daemon.sock")))
	if err == nil {
		t.Fatal("New succeeded with no daemon at the address")
	}
}

// --- a daemon with TLS and bearer tokens ---------------------------------------------

// authEnv is the environment a deployed agent would have: address, CA, token.
func authEnv(t *testing.T, token string) map[string]string {
	return map[string]string{
		AddressEnv: testEnv(t, "STRATAD_TEST_AUTH_ADDRESS"),
		TLSCAEnv:   testEnv(t, "STRATAD_TEST_AUTH_CA"),
		TokenEnv:   token,
	}
}

func connectAuth(t *testing.T, env map[string]string, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := New(ctx, append([]Option{envOf(env)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func TestTLSAndTokenFromTheEnvironment(t *testing.T) {
	ctx := context.Background()
	agent := connectAuth(t, authEnv(t, testEnv(t, "STRATAD_TEST_AGENT_TOKEN")))
	id := unique("secure")
	must(agent.CreateSession(ctx, id, nil))(t)
	must(agent.SaveState(ctx, id, []byte("over TLS"), nil))(t)
	if got := must(agent.LoadState(ctx, id, nil))(t).GetData(); string(got) != "over TLS" {
		t.Fatalf("loaded %q", got)
	}
	// The token's tenant is acme: an admin acting in acme sees the session.
	admin := connectAuth(t, authEnv(t, testEnv(t, "STRATAD_TEST_ADMIN_TOKEN")), WithTenant("acme"))
	if _, err := admin.GetSession(ctx, id); err != nil {
		t.Fatalf("admin in tenant acme: %v", err)
	}
	// AdminService needs role admin.
	_, err := agent.AdminService.GetStoreStats(ctx, &stratadv1.GetStoreStatsRequest{})
	if !errors.Is(err, ErrPermissionDenied) || ReasonOf(err) != ErrAdminRoleRequired {
		t.Fatalf("an agent calling AdminService: got %v", err)
	}
}

func TestTokenFileFromTheEnvironment(t *testing.T) {
	env := authEnv(t, "")
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(testEnv(t, "STRATAD_TEST_AGENT_TOKEN")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env[TokenFileEnv] = path
	client := connectAuth(t, env)
	if _, err := client.ListSessions(context.Background(), ""); err != nil {
		t.Fatalf("with %s: %v", TokenFileEnv, err)
	}
}

func TestAuthFailuresAreTypedErrors(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		token  string
		tenant string
		want   Reason
		reason Reason
	}{
		{"no token", "", "", ErrUnauthenticated, ErrMissingCredentials},
		{"unknown token", "not-a-real-token", "", ErrUnauthenticated, ErrInvalidToken},
		{"agent naming another tenant", testEnv(t, "STRATAD_TEST_AGENT_TOKEN"), "other", ErrPermissionDenied, ErrTenantMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := connectAuth(t, authEnv(t, tc.token), WithTenant(tc.tenant))
			_, err := client.ListSessions(ctx, "")
			if !errors.Is(err, tc.want) || ReasonOf(err) != tc.reason {
				t.Fatalf("got %v, want %s with reason %s", err, tc.want, tc.reason)
			}
		})
	}
}

func TestPlaintextToATLSDaemonFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	address := testEnv(t, "STRATAD_TEST_AUTH_ADDRESS")
	_, err := New(ctx, envOf(nil), WithAddress(address), WithInsecure())
	if err == nil {
		t.Fatal("a plaintext client reached a TLS-only daemon")
	}
}
