package stratad

// TLS mismatches: the errors name the fix (diagnose.go). The daemon tests use
// the variables of daemon_test.go, and for the mTLS case
//
//	STRATAD_TEST_MTLS_ADDRESS   a daemon that requires client certificates
//	                            signed by STRATAD_TEST_AUTH_CA
//
// which tests/e2e/test_tls_mismatch.py sets (with STRATAD_TEST_REQUIRE_MTLS=1:
// then that case must run, not skip).

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestTCPEndpoint(t *testing.T) {
	cases := map[string]string{
		"127.0.0.1:50051":               "127.0.0.1:50051",
		"localhost:1":                   "localhost:1",
		"[::1]:50051":                   "[::1]:50051",
		"dns:///stratad.svc:50051":      "stratad.svc:50051",
		"dns://8.8.8.8/stratad.svc:443": "stratad.svc:443",
		"unix:/run/stratad.sock":        "",
		"unix:///run/stratad.sock":      "",
		"unix-abstract:stratad":         "",
		"localhost":                     "",
		"localhost:0":                   "",
		"localhost:http":                "",
		"xds:///stratad":                "",
	}
	for address, want := range cases {
		got, ok := tcpEndpoint(address)
		if got != want || ok != (want != "") {
			t.Errorf("tcpEndpoint(%q) = %q, %v; want %q", address, got, ok, want)
		}
	}
}

// selfSigned is a throwaway certificate for a local TLS listener.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serveTLS accepts TLS connections as conf says, and completes their handshakes.
func serveTLS(t *testing.T, conf *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if conn.(*tls.Conn).Handshake() == nil {
					conn.Read(make([]byte, 1)) // the client's certificate is checked on the first read (TLS 1.3)
				}
			}()
		}
	}()
	return lis.Addr().String()
}

func TestProbeTellsWhatThePortSpeaks(t *testing.T) {
	cert := selfSigned(t)
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	go server.Serve(plain)
	t.Cleanup(server.Stop)
	cases := []struct {
		name    string
		address string
		want    finding
	}{
		{"TLS", serveTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}}), findingTLS},
		{"TLS 1.3 with client certificates", serveTLS(t, &tls.Config{
			Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert,
		}), findingTLSClientCert},
		{"TLS 1.2 with client certificates", serveTLS(t, &tls.Config{
			Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MaxVersion: tls.VersionTLS12,
		}), findingTLSClientCert},
		{"plaintext gRPC", plain.Addr().String(), findingPlaintextH2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
			defer cancel()
			if got := probe(ctx, tc.address, "", true); got != tc.want {
				t.Fatalf("probe found %d, want %d", got, tc.want)
			}
		})
	}
	// Nobody listening: nothing to tell, and no message invented.
	closed := plain.Addr().String()
	server.Stop()
	if d := diagnose(closed, &TLSConfig{}); d != nil {
		t.Fatalf("a closed port diagnosed as %s", string(d.reason))
	}
}

// wantMismatch checks err is Unavailable with reason, and that its message names each of fixes.
func wantMismatch(t *testing.T, err error, reason Reason, fixes ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("the call succeeded")
	}
	e, ok := AsError(err)
	if !ok || !errors.Is(err, ErrUnavailable) || status.Code(e) != codes.Unavailable {
		t.Fatalf("got %v, want an *Error with code Unavailable", err)
	}
	if !errors.Is(err, reason) || e.Reason != reason {
		t.Fatalf("reason %q, want %q: %v", string(e.Reason), string(reason), err)
	}
	for _, fix := range fixes {
		if !strings.Contains(e.Message, fix) {
			t.Fatalf("the message does not name %q: %s", fix, e.Message)
		}
	}
	// status.FromError sees the reason too, as for a daemon's error.
	if info := errorInfo(e.GRPCStatus()); info == nil || info.GetReason() != string(reason) {
		t.Fatalf("status details: %v", e.GRPCStatus().Details())
	}
}

// mismatch makes a call with opts (Dial, then GetSession) and New with opts;
// both must fail with reason and name the fixes.
func mismatch(t *testing.T, reason Reason, fixes []string, opts ...Option) {
	t.Helper()
	client, err := Dial(append([]Option{envOf(nil)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = client.GetSession(ctx, "s")
	wantMismatch(t, err, reason, fixes...)

	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = New(ctx, append([]Option{envOf(nil)}, opts...)...)
	wantMismatch(t, err, reason, fixes...)
	if !strings.HasPrefix(err.Error(), "stratad: no daemon ready at ") {
		t.Fatalf("New: %v", err)
	}
}

func TestTLSMismatchesNameTheFix(t *testing.T) {
	t.Run("plaintext client, TLS daemon", func(t *testing.T) {
		address := testEnv(t, "STRATAD_TEST_AUTH_ADDRESS")
		mismatch(t, ErrTLSRequired, []string{address + " speaks TLS", "WithTLS", "STRATAD_TLS_CA"},
			WithAddress(address), WithInsecure())
	})
	t.Run("TLS client, plaintext daemon", func(t *testing.T) {
		address := testEnv(t, "STRATAD_TEST_ADDRESS")
		ca := testEnv(t, "STRATAD_TEST_AUTH_CA")
		mismatch(t, ErrTLSNotSupported, []string{address + " does not speak TLS", "WithInsecure()", "unset STRATAD_TLS"},
			WithAddress(address), WithTLS(TLSConfig{CAFile: ca}))
	})
	t.Run("TLS client without a certificate, mTLS daemon", func(t *testing.T) {
		address := os.Getenv("STRATAD_TEST_MTLS_ADDRESS")
		if address == "" {
			if os.Getenv("STRATAD_TEST_REQUIRE_MTLS") == "1" {
				t.Fatal("STRATAD_TEST_MTLS_ADDRESS is not set (STRATAD_TEST_REQUIRE_MTLS=1)")
			}
			t.Skip("STRATAD_TEST_MTLS_ADDRESS is not set: no mTLS daemon (tests/e2e/test_tls_mismatch.py sets it)")
		}
		ca := testEnv(t, "STRATAD_TEST_AUTH_CA")
		mismatch(t, ErrClientCertRequired, []string{address + " requires a client certificate", "CertFile", "STRATAD_TLS_CERT"},
			WithAddress(address), WithTLS(TLSConfig{CAFile: ca}))
	})
}
