package stratad

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stratadv1 "github.com/stratad/stratad/clients/go/stratadv1"
)

// DefaultConnectTimeout bounds New's wait for the daemon when ctx has no deadline.
const DefaultConnectTimeout = 10 * time.Second

// retryServiceConfig is the Python SDK's retry policy: a call that fails with
// UNAVAILABLE (connection refused or reset, a daemon shutting down) is
// retried with exponential backoff, up to 5 attempts in all. gRPC never
// retries once the daemon has sent response headers.
const retryServiceConfig = `{
  "methodConfig": [{
    "name": [
      {"service": "stratad.api.v1.SessionService"},
      {"service": "stratad.api.v1.CheckpointService"},
      {"service": "stratad.api.v1.TaskService"},
      {"service": "stratad.api.v1.CognitiveStateService"},
      {"service": "stratad.api.v1.AgentStateService"},
      {"service": "stratad.api.v1.ProfileService"},
      {"service": "stratad.api.v1.CrystalService"},
      {"service": "stratad.api.v1.AdminService"}
    ],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.05s",
      "maxBackoff": "2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// Client is a connection to a stratad daemon. It is safe for concurrent use;
// make one per daemon (and tenant) and Close it when done.
//
// The stub fields are the generated clients of every service: calls through
// them carry the same tenant, token, default deadline, retries and *Error
// errors as the methods of Client.
type Client struct {
	SessionService        stratadv1.SessionServiceClient
	CheckpointService     stratadv1.CheckpointServiceClient
	TaskService           stratadv1.TaskServiceClient
	CognitiveStateService stratadv1.CognitiveStateServiceClient
	AgentStateService     stratadv1.AgentStateServiceClient
	ProfileService        stratadv1.ProfileServiceClient
	CrystalService        stratadv1.CrystalServiceClient
	AdminService          stratadv1.AdminServiceClient

	conn     *grpc.ClientConn
	address  string
	tenant   string
	metadata []string // key, value, ... added to every call
	timeout  time.Duration
	// tls is the client's TLS (nil: plaintext) and probeable whether address
	// is TCP: a TLS mismatch there is diagnosed when a call fails (diagnose.go).
	tls       *TLSConfig
	probeable bool
}

// New connects to the daemon and waits until it answers a health check, at
// most until ctx ends (DefaultConnectTimeout when ctx has no deadline): a
// wrong address, TLS setting or unreachable daemon fails here, not on the
// first call. Options win over the STRATAD_* variables.
func New(ctx context.Context, opts ...Option) (*Client, error) {
	client, err := Dial(opts...)
	if err != nil {
		return nil, err
	}
	if err := client.WaitReady(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return client, nil
}

// Dial makes a Client without contacting the daemon: the connection is made
// on the first call (and remade after a failure). Use it when the daemon may
// start after the agent; New otherwise.
func Dial(opts ...Option) (*Client, error) {
	s, err := resolve(opts)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if s.tls != nil {
		if creds, err = s.tls.credentials(); err != nil {
			return nil, err
		}
	}
	c := &Client{address: s.address, tenant: s.tenant, timeout: s.timeout, tls: s.tls}
	_, c.probeable = tcpEndpoint(s.address)
	if s.tenant != "" {
		c.metadata = append(c.metadata, TenantHeader, s.tenant)
	}
	if s.token != "" {
		c.metadata = append(c.metadata, "authorization", "Bearer "+s.token)
	}
	maxBytes := s.maxMessageBytes + messageHeadroom
	conn, err := grpc.NewClient(s.address,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(retryServiceConfig),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxBytes), grpc.MaxCallSendMsgSize(maxBytes)),
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor),
		grpc.WithChainStreamInterceptor(c.streamInterceptor),
	)
	if err != nil {
		return nil, fmt.Errorf("stratad: cannot connect to %q: %w", s.address, err)
	}
	c.conn = conn
	c.SessionService = stratadv1.NewSessionServiceClient(conn)
	c.CheckpointService = stratadv1.NewCheckpointServiceClient(conn)
	c.TaskService = stratadv1.NewTaskServiceClient(conn)
	c.CognitiveStateService = stratadv1.NewCognitiveStateServiceClient(conn)
	c.AgentStateService = stratadv1.NewAgentStateServiceClient(conn)
	c.ProfileService = stratadv1.NewProfileServiceClient(conn)
	c.CrystalService = stratadv1.NewCrystalServiceClient(conn)
	c.AdminService = stratadv1.NewAdminServiceClient(conn)
	return c, nil
}

// Close closes the connection; calls in flight fail with codes.Canceled.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying gRPC connection (for other services, e.g. health).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Address is the daemon's address, as resolved from the options and environment.
func (c *Client) Address() string { return c.address }

// Tenant is the tenant every call names ("" when none: the daemon's default,
// or the token's tenant with auth on).
func (c *Client) Tenant() string { return c.tenant }

// WaitReady waits until the daemon answers a health check (SERVING), at most
// until ctx ends (DefaultConnectTimeout when ctx has no deadline).
func (c *Client) WaitReady(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultConnectTimeout)
		defer cancel()
	}
	health := healthpb.NewHealthClient(c.conn)
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		// Connections kept failing (not still being made): a TLS mismatch, say,
		// which the error can name. That is Unavailable, not a slow daemon.
		if c.probeable && c.conn.GetState() == connectivity.TransientFailure {
			if d := diagnose(c.address, c.tls); d != nil {
				err = d.error(c.address, status.Convert(err).Message())
			}
		}
		return fmt.Errorf("stratad: no daemon ready at %s: %w", c.address, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("stratad: daemon at %s is %s", c.address, resp.GetStatus())
	}
	return nil
}

// outgoing adds the tenant and token to ctx's outgoing metadata.
func (c *Client) outgoing(ctx context.Context) context.Context {
	if len(c.metadata) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, c.metadata...)
}

func (c *Client) unaryInterceptor(ctx context.Context, method string, req, reply any,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption,
) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	// Unavailable after gRPC's retries, because of a TLS mismatch: an error that names the fix.
	return toError(c.explain(invoker(c.outgoing(ctx), method, req, reply, cc, opts...)))
}

// Streams (WatchSession, SaveStates) get no default deadline: they may
// rightly last as long as the caller's context.
func (c *Client) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc,
	cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption,
) (grpc.ClientStream, error) {
	stream, err := streamer(c.outgoing(ctx), desc, cc, method, opts...)
	if err != nil {
		return nil, toError(c.explain(err))
	}
	return &errorMappingStream{stream}, nil
}

// errorMappingStream turns the errors of a stream into *Error (io.EOF stays
// io.EOF: the stream's normal end).
type errorMappingStream struct{ grpc.ClientStream }

func (s *errorMappingStream) RecvMsg(m any) error { return streamError(s.ClientStream.RecvMsg(m)) }
func (s *errorMappingStream) SendMsg(m any) error { return streamError(s.ClientStream.SendMsg(m)) }
func (s *errorMappingStream) CloseSend() error    { return streamError(s.ClientStream.CloseSend()) }

func streamError(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	return toError(err)
}
