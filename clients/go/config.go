package stratad

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
)

// The variables a Client reads when an option does not say otherwise. They
// are the Python SDK's (stratad.sdk.connection), with the same meaning.
const (
	// AddressEnv: HOST:PORT or unix:/path of the daemon.
	AddressEnv = "STRATAD_ADDRESS"
	// TenantEnv: the tenant to act in (auth off, or an admin acting for a tenant).
	TenantEnv = "STRATAD_TENANT"
	// TokenEnv: a bearer token, sent as "authorization: Bearer <token>".
	TokenEnv = "STRATAD_TOKEN"
	// TokenFileEnv: a file holding the token (a mounted secret), read when
	// TokenEnv is empty; surrounding whitespace is not part of the token.
	TokenFileEnv = "STRATAD_TOKEN_FILE"
	// TLSEnv: "1", "true", "yes" or "on" for TLS with the system's CA certificates.
	TLSEnv = "STRATAD_TLS"
	// TLSCAEnv: a PEM file of CA certificates to verify the daemon with (implies TLS).
	TLSCAEnv = "STRATAD_TLS_CA"
	// TLSCertEnv and TLSKeyEnv: the client certificate and key for mTLS (imply TLS).
	TLSCertEnv = "STRATAD_TLS_CERT"
	TLSKeyEnv  = "STRATAD_TLS_KEY"
	// TLSServerNameEnv: the name the daemon's certificate must carry, when it
	// is not the host dialed (e.g. when dialing an IP address).
	TLSServerNameEnv = "STRATAD_TLS_SERVER_NAME"
)

const (
	// DefaultAddress is where a Client connects when neither an option nor
	// STRATAD_ADDRESS names an address.
	DefaultAddress = "127.0.0.1:50051"
	// DefaultTimeout is the deadline of a unary call whose context has none.
	DefaultTimeout = 30 * time.Second
	// DefaultMaxMessageBytes is the daemon's default max_message_bytes: the
	// largest state a single SaveState can carry.
	DefaultMaxMessageBytes = 64 << 20
	// TenantHeader is the metadata key that names the tenant of a call.
	TenantHeader = "x-stratad-tenant"
	// messageHeadroom is what a message needs beyond its state (IDs, metadata):
	// the client never refuses what the daemon would accept.
	messageHeadroom = 1 << 20
)

// TLSConfig says how to verify the daemon and, for mTLS, which certificate to
// show it. Paths name PEM files; an empty CAFile means the system's CAs.
type TLSConfig struct {
	CAFile     string
	CertFile   string
	KeyFile    string
	ServerName string
}

// An Option changes how New or Dial connects. Options win over the environment.
type Option func(*settings)

type settings struct {
	address         string
	tenant          string
	token           string
	tls             *TLSConfig
	plaintext       bool // WithInsecure: no TLS, whatever the environment says
	timeout         time.Duration
	maxMessageBytes int
	environ         func(string) string
}

// WithAddress sets the daemon's address: HOST:PORT or unix:/path.
func WithAddress(address string) Option { return func(s *settings) { s.address = address } }

// WithTenant sets the tenant every call acts in (the x-stratad-tenant header).
func WithTenant(tenant string) Option { return func(s *settings) { s.tenant = tenant } }

// WithToken sets the bearer token every call carries.
func WithToken(token string) Option { return func(s *settings) { s.token = token } }

// WithTLS connects over TLS as cfg says (a zero TLSConfig: the system's CAs).
func WithTLS(cfg TLSConfig) Option {
	return func(s *settings) { s.tls, s.plaintext = &cfg, false }
}

// WithInsecure connects in plaintext, whatever the STRATAD_TLS* variables say.
func WithInsecure() Option { return func(s *settings) { s.tls, s.plaintext = nil, true } }

// WithTimeout sets the deadline of unary calls whose context has none
// (DefaultTimeout otherwise). Streams get no default deadline.
func WithTimeout(d time.Duration) Option { return func(s *settings) { s.timeout = d } }

// WithMaxMessageBytes sets the largest message sent or received; match the
// daemon's max_message_bytes when it is not the default (64 MiB).
func WithMaxMessageBytes(n int) Option { return func(s *settings) { s.maxMessageBytes = n } }

// WithEnv reads the STRATAD_* variables through lookup instead of os.Getenv
// (tests; or func(string) string { return "" } to ignore the environment).
func WithEnv(lookup func(string) string) Option { return func(s *settings) { s.environ = lookup } }

// resolve applies the options over the environment over the defaults.
func resolve(opts []Option) (*settings, error) {
	s := &settings{environ: os.Getenv}
	for _, opt := range opts {
		opt(s)
	}
	env := s.environ
	s.address = firstNonEmpty(s.address, env(AddressEnv), DefaultAddress)
	s.tenant = firstNonEmpty(s.tenant, env(TenantEnv))
	if s.token == "" {
		token, err := tokenFromEnv(env)
		if err != nil {
			return nil, err
		}
		s.token = token
	}
	if s.tls == nil && !s.plaintext {
		s.tls = tlsFromEnv(env)
	}
	if s.tls != nil && (s.tls.CertFile == "") != (s.tls.KeyFile == "") {
		return nil, errors.New("stratad: a client certificate needs its key: set both CertFile and KeyFile")
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.maxMessageBytes <= 0 {
		s.maxMessageBytes = DefaultMaxMessageBytes
	}
	return s, nil
}

func tokenFromEnv(env func(string) string) (string, error) {
	if token := env(TokenEnv); token != "" {
		return token, nil
	}
	path := env(TokenFileEnv)
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(expandHome(path))
	if err != nil {
		return "", fmt.Errorf("stratad: reading %s: %w", TokenFileEnv, err)
	}
	// A mounted secret usually ends with a newline that is not part of the token.
	return strings.TrimSpace(string(data)), nil
}

func tlsFromEnv(env func(string) string) *TLSConfig {
	cfg := TLSConfig{
		CAFile:     env(TLSCAEnv),
		CertFile:   env(TLSCertEnv),
		KeyFile:    env(TLSKeyEnv),
		ServerName: env(TLSServerNameEnv),
	}
	if cfg.CAFile == "" && cfg.CertFile == "" && cfg.KeyFile == "" && !isTrue(env(TLSEnv)) {
		return nil
	}
	return &cfg
}

// credentials builds the transport credentials of a TLS config.
func (c *TLSConfig) credentials() (credentials.TransportCredentials, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(expandHome(c.CAFile))
		if err != nil {
			return nil, fmt.Errorf("stratad: reading the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("stratad: no PEM certificate in the CA file %s", c.CAFile)
		}
		conf.RootCAs = pool
	}
	if c.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(expandHome(c.CertFile), expandHome(c.KeyFile))
		if err != nil {
			return nil, fmt.Errorf("stratad: loading the client certificate: %w", err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(conf), nil
}

func isTrue(value string) bool {
	switch strings.ToLower(value) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// expandHome expands a leading "~/" as the Python SDK does.
func expandHome(path string) string {
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return path
}
