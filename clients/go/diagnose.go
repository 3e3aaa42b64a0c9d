package stratad

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Why a connection failed, when the client's and the daemon's TLS settings
// differ. A plaintext client on a TLS listener, a TLS client without a
// certificate on an mTLS listener and a TLS client on a plaintext listener all
// fail as Unavailable with what the transport saw ("error reading server
// preface: unexpected EOF", "broken pipe", "first record does not look like a
// TLS handshake"), which does not say what to change. So when a call fails
// Unavailable without having reached the daemon (no stratad ErrorInfo), after
// gRPC's retries, the client probes the address once, within probeTimeout: a
// TLS handshake with certificate verification off (only to learn whether the
// port speaks TLS, and whether it asks for a client certificate and refuses a
// client without one), and if the port does not speak TLS, the HTTP/2 client
// preface in plaintext (a plaintext daemon answers with its SETTINGS frame).
// When that explains the failure, the *Error keeps its Unavailable code, names
// the fix in its Message and carries the reason ErrTLSRequired,
// ErrClientCertRequired or ErrTLSNotSupported. Unix sockets and successful
// calls are never probed, and nothing is remembered: the next failure probes
// again (the daemon may have restarted with other settings).

// probeTimeout bounds what a probe adds to a failed call, both connections included.
const probeTimeout = 2 * time.Second

type finding int

const (
	findingUnknown       finding = iota // unreachable, silent, or something else
	findingTLS                          // speaks TLS; serves a client without a certificate
	findingTLSClientCert                // speaks TLS, refuses a client without a certificate
	findingPlaintextH2                  // answered the HTTP/2 preface in plaintext
)

var (
	h2Preface       = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	h2EmptySettings = []byte{0, 0, 0, 4, 0, 0, 0, 0, 0}
)

// tcpEndpoint is the host:port a gRPC target dials; ok is false for unix
// sockets and targets of other schemes.
func tcpEndpoint(address string) (hostport string, ok bool) {
	rest := address
	switch {
	case strings.HasPrefix(rest, "dns://"), strings.HasPrefix(rest, "passthrough://"):
		// dns:///host:port, or dns://resolver/host:port
		_, rest, _ = strings.Cut(rest[strings.Index(rest, "://")+3:], "/")
	case strings.HasPrefix(rest, "dns:"):
		rest = strings.TrimPrefix(rest, "dns:")
	case strings.Contains(rest, "://"), strings.HasPrefix(rest, "unix"):
		return "", false
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" || strings.Contains(host, "/") {
		return "", false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", false
	}
	return rest, true
}

// probe says whether the port speaks TLS (and refuses a client without a
// certificate), or (plaintext: asked only when the port is not TLS) plaintext HTTP/2.
func probe(ctx context.Context, hostport, serverName string, plaintext bool) finding {
	if f, isTLS := probeTLS(ctx, hostport, serverName); isTLS {
		return f
	}
	if plaintext && speaksPlaintextH2(ctx, hostport) {
		return findingPlaintextH2
	}
	return findingUnknown
}

// probeTLS does a TLS handshake with verification off; isTLS is false when the
// port answered with something that is not TLS.
func probeTLS(ctx context.Context, hostport, serverName string) (f finding, isTLS bool) {
	var dialer net.Dialer
	raw, err := dialer.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return findingUnknown, true
	}
	defer raw.Close()
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	if serverName == "" {
		serverName, _, _ = net.SplitHostPort(hostport)
	}
	asked := false
	conn := tls.Client(raw, &tls.Config{
		ServerName: serverName,
		// What the port speaks, not whom it proves to be: nothing is sent over it.
		InsecureSkipVerify: true,
		NextProtos:         []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked = true
			return &tls.Certificate{}, nil // none: as the failed client did
		},
	})
	err = conn.HandshakeContext(ctx)
	var notTLS tls.RecordHeaderError
	switch {
	case errors.As(err, &notTLS):
		return findingUnknown, false
	case err != nil && asked && certificateAlert(err):
		return findingTLSClientCert, true // TLS 1.2: refused in the handshake
	case err != nil:
		if remoteAlert(err) {
			return findingTLS, true
		}
		return findingUnknown, true
	case !asked:
		return findingTLS, true
	}
	// TLS 1.3: the server checks the (empty) certificate once the client has
	// finished; a refusal is the first thing it sends.
	if _, err := conn.Read(make([]byte, 1)); err != nil && certificateAlert(err) {
		return findingTLSClientCert, true
	}
	return findingTLS, true
}

// remoteAlert reports whether err is a TLS alert the server sent.
func remoteAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// certificateAlert reports whether err is an alert a server sends a client
// that did not present the certificate it asked for.
func certificateAlert(err error) bool {
	if !remoteAlert(err) {
		return false
	}
	text := err.Error()
	for _, alert := range []string{"certificate required", "handshake failure", "bad certificate"} {
		if strings.Contains(text, alert) {
			return true
		}
	}
	return false
}

// speaksPlaintextH2 reports whether the port answers the HTTP/2 client
// preface with a SETTINGS frame.
func speaksPlaintextH2(ctx context.Context, hostport string) bool {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return false
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	if _, err := conn.Write(append(append([]byte{}, h2Preface...), h2EmptySettings...)); err != nil {
		return false
	}
	head := make([]byte, 9)
	if _, err := io.ReadFull(conn, head); err != nil {
		return false
	}
	// A frame header: length (3), type 4 (SETTINGS), flags, stream 0.
	return head[3] == 4 && head[5] == 0 && head[6] == 0 && head[7] == 0 && head[8] == 0
}

// diagnosis is a TLS mismatch: its reason and the message that names the fix.
type diagnosis struct {
	reason  Reason
	message string
}

// diagnose probes address and says which TLS setting to change, if one
// explains a failed connection. cfg is the client's TLS (nil: plaintext).
func diagnose(address string, cfg *TLSConfig) *diagnosis {
	hostport, ok := tcpEndpoint(address)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	serverName := ""
	if cfg != nil {
		serverName = cfg.ServerName
	}
	// A plaintext client needs to know only whether the port speaks TLS.
	f := probe(ctx, hostport, serverName, cfg != nil)
	switch {
	case cfg == nil && f == findingTLS:
		return &diagnosis{ErrTLSRequired, fmt.Sprintf("the daemon at %s speaks TLS, but this client "+
			"connects in plaintext: turn TLS on with the CA that signed the daemon's certificate "+
			"(stratad.WithTLS(stratad.TLSConfig{CAFile: FILE}), or STRATAD_TLS_CA=FILE; a zero "+
			"TLSConfig, or STRATAD_TLS=true, if the system trusts it)", address)}
	case cfg == nil && f == findingTLSClientCert:
		return &diagnosis{ErrTLSRequired, fmt.Sprintf("the daemon at %s speaks TLS and requires a "+
			"client certificate (mTLS), but this client connects in plaintext: turn TLS on with the "+
			"CA that signed the daemon's certificate and a client certificate and key "+
			"(stratad.WithTLS(stratad.TLSConfig{CAFile: ..., CertFile: ..., KeyFile: ...}), or "+
			"STRATAD_TLS_CA, STRATAD_TLS_CERT and STRATAD_TLS_KEY)", address)}
	case cfg != nil && cfg.CertFile == "" && f == findingTLSClientCert:
		return &diagnosis{ErrClientCertRequired, fmt.Sprintf("the daemon at %s requires a client "+
			"certificate (mTLS), but this client presents none: give a certificate signed by the "+
			"daemon's client CA, and its key (stratad.TLSConfig{CertFile: FILE, KeyFile: FILE}, or "+
			"STRATAD_TLS_CERT and STRATAD_TLS_KEY)", address)}
	case cfg != nil && f == findingPlaintextH2:
		return &diagnosis{ErrTLSNotSupported, fmt.Sprintf("the daemon at %s does not speak TLS (it "+
			"answered in plaintext HTTP/2), but this client connects with TLS: drop the TLS "+
			"settings, or dial the daemon's TLS listener (stratad.WithInsecure(), or unset "+
			"STRATAD_TLS, STRATAD_TLS_CA, STRATAD_TLS_CERT and STRATAD_TLS_KEY)", address)}
	}
	return nil
}

// error is the *Error of a diagnosed failure: Unavailable, the message that
// names the fix (then what the transport said), the reason as ErrorInfo.
func (d *diagnosis) error(address, transport string) *Error {
	message := d.message
	if transport != "" {
		message += " (the connection failed with: " + transport + ")"
	}
	metadata := map[string]string{"address": address}
	st := status.New(codes.Unavailable, message)
	if detailed, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: string(d.reason), Domain: ErrorDomain, Metadata: metadata,
	}); err == nil {
		st = detailed
	}
	return &Error{Code: codes.Unavailable, Message: message, Reason: d.reason, Metadata: metadata, status: st}
}

// explain returns err, or (a call that failed Unavailable before reaching the
// daemon, because of a TLS mismatch) an *Error whose message names the fix.
func (c *Client) explain(err error) error {
	if err == nil || !c.probeable {
		return err
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable || errorInfo(st) != nil {
		return err // a daemon's own Unavailable (SHUTTING_DOWN...) carries an ErrorInfo
	}
	if d := diagnose(c.address, c.tls); d != nil {
		return d.error(c.address, st.Message())
	}
	return err
}
