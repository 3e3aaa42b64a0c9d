package stratad

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// envOf is a fake environment: only the given variables are set.
func envOf(vars map[string]string) Option {
	return WithEnv(func(key string) string { return vars[key] })
}

func TestResolveDefaultsWithAnEmptyEnvironment(t *testing.T) {
	s, err := resolve([]Option{envOf(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if s.address != DefaultAddress || s.tenant != "" || s.token != "" || s.tls != nil {
		t.Fatalf("defaults: got address=%q tenant=%q token=%q tls=%v", s.address, s.tenant, s.token, s.tls)
	}
	if s.timeout != DefaultTimeout || s.maxMessageBytes != DefaultMaxMessageBytes {
		t.Fatalf("defaults: got timeout=%v maxMessageBytes=%d", s.timeout, s.maxMessageBytes)
	}
}

func TestResolveReadsThePythonSDKVariables(t *testing.T) {
	s, err := resolve([]Option{envOf(map[string]string{
		AddressEnv:       "unix:/run/stratad.sock",
		TenantEnv:        "acme",
		TokenEnv:         "s3cret",
		TLSCAEnv:         "/etc/stratad/ca.pem",
		TLSServerNameEnv: "stratad.internal",
	})})
	if err != nil {
		t.Fatal(err)
	}
	if s.address != "unix:/run/stratad.sock" || s.tenant != "acme" || s.token != "s3cret" {
		t.Fatalf("got address=%q tenant=%q token=%q", s.address, s.tenant, s.token)
	}
	want := TLSConfig{CAFile: "/etc/stratad/ca.pem", ServerName: "stratad.internal"}
	if s.tls == nil || *s.tls != want {
		t.Fatalf("a CA file implies TLS: got %+v, want %+v", s.tls, want)
	}
}

func TestOptionsWinOverTheEnvironment(t *testing.T) {
	s, err := resolve([]Option{
		envOf(map[string]string{AddressEnv: "env:1", TenantEnv: "env", TokenEnv: "env", TLSEnv: "true"}),
		WithAddress("opt:2"), WithTenant("opt"), WithToken("opt"), WithInsecure(),
		WithTimeout(time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.address != "opt:2" || s.tenant != "opt" || s.token != "opt" || s.tls != nil || s.timeout != time.Second {
		t.Fatalf("options must win: got %+v", s)
	}
}

func TestTLSFlagAloneMeansSystemCAs(t *testing.T) {
	for _, value := range []string{"1", "true", "YES", "on"} {
		s, err := resolve([]Option{envOf(map[string]string{TLSEnv: value})})
		if err != nil {
			t.Fatal(err)
		}
		if s.tls == nil || *s.tls != (TLSConfig{}) {
			t.Fatalf("%s=%s: got %+v, want TLS with the system's CAs", TLSEnv, value, s.tls)
		}
	}
	s, err := resolve([]Option{envOf(map[string]string{TLSEnv: "false"})})
	if err != nil || s.tls != nil {
		t.Fatalf("%s=false: got %+v, %v; want plaintext", TLSEnv, s.tls, err)
	}
}

func TestTokenFileIsReadAndTrimmed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("  file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := resolve([]Option{envOf(map[string]string{TokenFileEnv: path})})
	if err != nil {
		t.Fatal(err)
	}
	if s.token != "file-token" {
		t.Fatalf("token from %s: got %q", TokenFileEnv, s.token)
	}
	// STRATAD_TOKEN wins over the file.
	s, err = resolve([]Option{envOf(map[string]string{TokenEnv: "env-token", TokenFileEnv: path})})
	if err != nil || s.token != "env-token" {
		t.Fatalf("got %q, %v; want env-token", s.token, err)
	}
}

func TestUnreadableTokenFileFails(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	_, err := resolve([]Option{envOf(map[string]string{TokenFileEnv: missing})})
	if err == nil || !strings.Contains(err.Error(), TokenFileEnv) {
		t.Fatalf("got %v, want an error naming %s", err, TokenFileEnv)
	}
}

func TestCertificateWithoutKeyFails(t *testing.T) {
	_, err := resolve([]Option{envOf(map[string]string{TLSCertEnv: "/x/client.pem"})})
	if err == nil || !strings.Contains(err.Error(), "key") {
		t.Fatalf("got %v, want an error about the missing key", err)
	}
	_, err = Dial(envOf(nil), WithTLS(TLSConfig{KeyFile: "/x/client.key"}))
	if err == nil {
		t.Fatal("Dial accepted a key without its certificate")
	}
}

func TestDialRefusesACAFileWithoutCertificates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(envOf(map[string]string{TLSCAEnv: path}))
	if err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("got %v, want a refusal of the CA file", err)
	}
}
