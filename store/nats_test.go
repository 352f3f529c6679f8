package store_test

import (
	"context"
	"crypto/tls"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/store"
)

// operator is an operator, an account with JetStream and a user of it, as
// a NATS deployment with decentralized auth (JWTs) has them; creds is the
// user's credentials file.
type operator struct {
	claims   *jwt.OperatorClaims
	accounts map[string]string // public key: JWT; the system account's too
	system   string
	creds    []byte
	seed     string // the user's, a secret
}

func newOperator(t *testing.T) operator {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opPub, err := okp.PublicKey()
	must(err)
	oc := jwt.NewOperatorClaims(opPub)
	// JetStream needs a system account.
	skp, err := nkeys.CreateAccount()
	must(err)
	sysPub, err := skp.PublicKey()
	must(err)
	oc.SystemAccount = sysPub
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(okp)
	must(err)
	akp, err := nkeys.CreateAccount()
	must(err)
	aPub, err := akp.PublicKey()
	must(err)
	ac := jwt.NewAccountClaims(aPub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	aJWT, err := ac.Encode(okp)
	must(err)
	ukp, err := nkeys.CreateUser()
	must(err)
	uPub, err := ukp.PublicKey()
	must(err)
	uJWT, err := jwt.NewUserClaims(uPub).Encode(akp)
	must(err)
	seed, err := ukp.Seed()
	must(err)
	creds, err := jwt.FormatUserConfig(uJWT, seed)
	must(err)
	return operator{claims: oc, accounts: map[string]string{sysPub: sysJWT, aPub: aJWT}, system: sysPub, creds: creds, seed: string(seed)}
}

// serve configures a NATS server to trust the operator and know its
// account.
func (op operator) serve(o *natsserver.Options) {
	r := &natsserver.MemAccResolver{}
	for pub, j := range op.accounts {
		_ = r.Store(pub, j)
	}
	o.TrustedOperators = []*jwt.OperatorClaims{op.claims}
	o.AccountResolver = r
	o.SystemAccount = op.system
}

// TestNATSAuthAndTLS opens the store on a NATS server that needs TLS (the
// server's CA; a client certificate) or credentials (a user and password
// in the URL; a credentials file), as store.nats configures them. Wrong
// or missing ones fail Open with an error that says what went wrong and
// never holds the secret.
func TestNATSAuthAndTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, otherCA := wiretest.NewCA(t, "nats CA"), wiretest.NewCA(t, "client CA"), wiretest.NewCA(t, "another CA")
	cert, key := serverCA.Issue(t, "nats", true)
	serverCert, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, clientKey := clientCA.Issue(t, "turnstile", false)
	files := map[string]string{
		"ca":         wiretest.WriteFile(t, dir, "ca.pem", serverCA.PEM),
		"other ca":   wiretest.WriteFile(t, dir, "other.pem", otherCA.PEM),
		"client":     wiretest.WriteFile(t, dir, "client.pem", clientCert),
		"client key": wiretest.WriteFile(t, dir, "client-key.pem", clientKey),
	}
	withTLS := func(verifyClients bool) func(*natsserver.Options) {
		return func(o *natsserver.Options) {
			o.TLS, o.TLSTimeout = true, 5
			o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}
			if verifyClients {
				o.TLSVerify = true
				o.TLSConfig.ClientCAs = clientCA.Pool()
				o.TLSConfig.ClientAuth = tls.RequireAndVerifyClientCert
			}
		}
	}
	const password = "pw-0f8a1c"
	withUser := func(o *natsserver.Options) {
		o.Users = []*natsserver.User{{Username: "turnstile", Password: password}}
	}
	op := newOperator(t)
	files["creds"] = wiretest.WriteFile(t, dir, "user.creds", op.creds)
	stranger := newOperator(t) // a user of an account the server does not know
	files["stranger creds"] = wiretest.WriteFile(t, dir, "stranger.creds", stranger.creds)

	tlsURL := natstest.StartWith(t, withTLS(false))
	mtlsURL := natstest.StartWith(t, withTLS(true))
	userURL := natstest.StartWith(t, withUser)
	opURL := natstest.StartWith(t, op.serve)
	withPassword := func(u, pw string) string {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		p.User = url.UserPassword("turnstile", pw)
		return p.String()
	}

	tests := []struct {
		name    string
		nats    store.NATS
		wantErr string   // empty: Open works
		secrets []string // never in the error
	}{
		{name: "TLS, the server checked against ca_file", nats: store.NATS{URL: tlsURL, CAFile: files["ca"]}},
		{name: "TLS, a CA that did not sign the server", nats: store.NATS{URL: tlsURL, CAFile: files["other ca"]}, wantErr: "certificate signed by unknown authority"},
		{name: "mutual TLS", nats: store.NATS{URL: mtlsURL, CAFile: files["ca"], CertFile: files["client"], KeyFile: files["client key"]}},
		{name: "mutual TLS without a client certificate", nats: store.NATS{URL: mtlsURL, CAFile: files["ca"]}, wantErr: "needs store.nats.cert_file and key_file"},
		{name: "a missing CA file", nats: store.NATS{URL: tlsURL, CAFile: dir + "/missing.pem"}, wantErr: "cannot be read"},
		{name: "a missing credentials file", nats: store.NATS{URL: opURL, Credentials: dir + "/missing.creds"}, wantErr: "missing.creds"},
		{name: "user and password in the URL", nats: store.NATS{URL: withPassword(userURL, password)}},
		{name: "a wrong password", nats: store.NATS{URL: withPassword(userURL, "wrong-"+password)}, wantErr: "authorization", secrets: []string{"wrong-" + password}},
		{name: "no credentials", nats: store.NATS{URL: userURL}, wantErr: "authorization"},
		{name: "a URL that does not parse, with a password", nats: store.NATS{URL: "nats://turnstile:" + password + "@127.0.0.1:port"}, wantErr: "nats.url: server 1 of the list is not a URL"},
		{name: "a server that is not there, with a password", nats: store.NATS{URL: "nats://turnstile:" + password + "@127.0.0.1:1"}, wantErr: "store.nats.url"},
		{name: "a credentials file", nats: store.NATS{URL: opURL, Credentials: files["creds"]}},
		{name: "a credentials file of an unknown account", nats: store.NATS{URL: opURL, Credentials: files["stranger creds"]}, wantErr: "authorization", secrets: []string{stranger.seed}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := store.DefaultConfig()
			cfg.Mode, cfg.NATS = store.ModeNATS, tt.nats
			// A server that is not there is waited for (it may be starting)
			// as long as the context allows.
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			s, err := store.Open(ctx, cfg, nil)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				defer s.Close()
				// The store works: a run is created and read back.
				if _, _, err := s.Create(context.Background(), "t", 1, []byte("record"), func(string) []byte { return nil }); err != nil {
					t.Fatal(err)
				}
				if err := s.Finish(context.Background(), "t", 1); err != nil {
					t.Fatal(err)
				}
				if rec, err := s.Record(context.Background(), "t", 1); err != nil || string(rec) != "record" {
					t.Fatalf("Record: %q, %v", rec, err)
				}
				return
			}
			if err == nil {
				s.Close()
				t.Fatal("Open worked")
			}
			msg := err.Error()
			if !strings.Contains(strings.ToLower(msg), strings.ToLower(tt.wantErr)) {
				t.Errorf("error %q does not say %q", msg, tt.wantErr)
			}
			for _, secret := range append(tt.secrets, password) {
				if strings.Contains(msg, secret) {
					t.Errorf("error %q holds a secret", msg)
				}
			}
			if b, _ := os.ReadFile(files["client key"]); strings.Contains(msg, string(b)) {
				t.Errorf("error %q holds the client key", msg)
			}
			t.Logf("%s", msg)
		})
	}
}
