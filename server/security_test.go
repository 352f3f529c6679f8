package server_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server"
)

// tlsServer serves over TLS from certificate files in a fresh directory,
// signed by its own CA; with mtls, client certificates of clientCA are
// required.
type tlsServer struct {
	*testServer
	ca                *wiretest.CA
	dir               string
	certFile, keyFile string
	clientCA          *wiretest.CA
	clientCAFile      string
	files             server.TLSFiles
	// tlsLogs holds what the TLS set-up logs: its reloads.
	tlsLogs *syncBuffer
}

func startTLS(t *testing.T, mtls bool) *tlsServer {
	t.Helper()
	s := &tlsServer{ca: wiretest.NewCA(t, "server CA"), dir: t.TempDir(), tlsLogs: &syncBuffer{}}
	c, k := s.ca.Issue(t, "turnstile", true)
	s.files = server.TLSFiles{CertFile: wiretest.WriteFile(t, s.dir, "cert.pem", c), KeyFile: wiretest.WriteFile(t, s.dir, "key.pem", k)}
	if mtls {
		s.clientCA = wiretest.NewCA(t, "client CA")
		s.files.ClientCAFile = wiretest.WriteFile(t, s.dir, "clients.pem", s.clientCA.PEM)
	}
	cfg, err := server.LoadTLS(s.files, newLogger(s.tlsLogs))
	if err != nil {
		t.Fatal(err)
	}
	s.testServer = start(t, runner(t, fake.NewProvider(fake.Reply{Chunks: fake.Text("hi")})), server.Options{TLS: cfg})
	return s
}

// dial connects with the TLS client configuration cfg.
func dial(t *testing.T, addr string, creds credentials.TransportCredentials) turnstilev1.AgentServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return turnstilev1.NewAgentServiceClient(conn)
}

// turnCode runs one turn and returns its final status code, that of the
// connection when it failed.
func turnCode(t *testing.T, c turnstilev1.AgentServiceClient, ctx context.Context) codes.Code {
	t.Helper()
	return turnStatus(t, c, ctx).Code()
}

func turnStatus(t *testing.T, c turnstilev1.AgentServiceClient, ctx context.Context) *status.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.RunTurn(ctx, hello())
	if err != nil {
		return status.Convert(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if err == io.EOF {
				return status.New(codes.OK, "")
			}
			return status.Convert(err)
		}
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	s := startTLS(t, false)
	trusting := credentials.NewTLS(&tls.Config{RootCAs: s.ca.Pool()})
	other := wiretest.NewCA(t, "someone else")
	tests := []struct {
		name  string
		creds credentials.TransportCredentials
		want  codes.Code
	}{
		{"client trusting the server's CA", trusting, codes.OK},
		{"plaintext client", insecure.NewCredentials(), codes.Unavailable},
		{"client trusting another CA", credentials.NewTLS(&tls.Config{RootCAs: other.Pool()}), codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := turnCode(t, dial(t, s.addr, tt.creds), t.Context()); got != tt.want {
				t.Errorf("turn ended %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	s := startTLS(t, true)
	stranger := wiretest.NewCA(t, "stranger CA")
	withCert := func(c *tls.Certificate) credentials.TransportCredentials {
		cfg := &tls.Config{RootCAs: s.ca.Pool()}
		if c != nil {
			cfg.Certificates = []tls.Certificate{*c}
		}
		return credentials.NewTLS(cfg)
	}
	good, bad := s.clientCA.ClientCert(t, "client"), stranger.ClientCert(t, "intruder")
	tests := []struct {
		name  string
		creds credentials.TransportCredentials
		want  codes.Code
	}{
		{"client certificate from the trusted CA", withCert(&good), codes.OK},
		{"no client certificate", withCert(nil), codes.Unavailable},
		{"client certificate from another CA", withCert(&bad), codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := turnCode(t, dial(t, s.addr, tt.creds), t.Context()); got != tt.want {
				t.Errorf("turn ended %v, want %v", got, tt.want)
			}
		})
	}
}

// TestTLSRotation: new connections get the certificate the files hold
// now, without a restart; files that do not load leave the previous one
// in use.
func TestTLSRotation(t *testing.T) {
	t.Parallel()
	s := startTLS(t, false)
	next := wiretest.NewCA(t, "next CA")
	trustNext := credentials.NewTLS(&tls.Config{RootCAs: next.Pool()})
	if got := turnCode(t, dial(t, s.addr, trustNext), t.Context()); got != codes.Unavailable {
		t.Fatalf("before rotation a client trusting only the next CA got %v", got)
	}
	// A half-done rotation (a new certificate, the old key) does not load.
	c, k := next.Issue(t, "turnstile", true)
	wiretest.WriteFile(t, s.dir, "cert.pem", c)
	trustOld := credentials.NewTLS(&tls.Config{RootCAs: s.ca.Pool()})
	s.handshakeUntil(t, "TLS files changed but do not load")
	if got := turnCode(t, dial(t, s.addr, trustOld), t.Context()); got != codes.OK {
		t.Fatalf("with a mismatched key file the old certificate should stay, got %v", got)
	}
	wiretest.WriteFile(t, s.dir, "key.pem", k)
	s.handshakeUntil(t, "TLS files reloaded")
	if got := turnCode(t, dial(t, s.addr, trustNext), t.Context()); got != codes.OK {
		t.Errorf("after rotation a client trusting the next CA got %v", got)
	}
	if got := turnCode(t, dial(t, s.addr, trustOld), t.Context()); got != codes.Unavailable {
		t.Errorf("after rotation a client trusting only the old CA got %v", got)
	}
}

// handshakeUntil starts TLS handshakes with s, which are when the server
// looks at its files again (at most once a second), until it has logged a
// line holding msg. The server's part of a handshake comes first: whether
// the client then trusts its certificate does not matter.
func (s *tlsServer) handshakeUntil(t *testing.T, msg string) {
	t.Helper()
	eventually(t, "the TLS set-up logs "+msg, func() bool {
		if c, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: s.ca.Pool(), NextProtos: []string{"h2"}}); err == nil {
			c.Close()
		}
		return strings.Contains(s.tlsLogs.String(), msg)
	})
}

func TestLoadTLSErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := wiretest.NewCA(t, "ca")
	c, k := ca.Issue(t, "s", true)
	cert, key := wiretest.WriteFile(t, dir, "c.pem", c), wiretest.WriteFile(t, dir, "k.pem", k)
	tests := []struct {
		name  string
		files server.TLSFiles
	}{
		{"missing cert file", server.TLSFiles{CertFile: dir + "/nope.pem", KeyFile: key}},
		{"key of another cert", server.TLSFiles{CertFile: cert, KeyFile: wiretest.WriteFile(t, dir, "k2.pem", func() []byte { _, k := ca.Issue(t, "x", true); return k }())}},
		{"client CA without a certificate", server.TLSFiles{CertFile: cert, KeyFile: key, ClientCAFile: wiretest.WriteFile(t, dir, "ca.pem", []byte("not pem"))}},
	}
	for _, tt := range tests {
		if _, err := server.LoadTLS(tt.files, nil); err == nil || !strings.HasPrefix(err.Error(), "server.tls") {
			t.Errorf("%s: LoadTLS = %v", tt.name, err)
		}
	}
	if ps := (server.TLSFiles{}).Problems(); len(ps) != 2 {
		t.Errorf("an empty tls block has %d problems, want cert_file and key_file", len(ps))
	}
}

// keyed returns a key named name whose token is token.
func keyed(name, token string, models ...string) server.Key {
	return server.Key{Name: name, TokenSHA256: sha256.Sum256([]byte(token)), Models: models}
}

func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// multiModel returns a runner with models a (the default), b and c, each
// answering "hi", and records the requests each got.
func multiModel(t *testing.T) *runtime.Runner {
	t.Helper()
	var models []*runtime.Model
	for _, a := range []string{"a", "b", "c"} {
		models = append(models, &runtime.Model{Alias: a, ProviderName: "fake", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("hi from " + a)}), ID: a, Retry: policy.DefaultRetry()})
	}
	r, err := runtime.New(models, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func TestBearerKeys(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	ts := start(t, multiModel(t), server.Options{
		Logger: newLogger(&logs),
		Keys:   []server.Key{keyed("ops", "tok-ops-0123456789"), keyed("team-b", "tok-b-0123456789", "b", "c")},
	})
	req := func(model string) *turnstilev1.RunTurnRequest {
		r := hello()
		r.Model = model
		return r
	}
	tests := []struct {
		name   string
		token  string
		req    *turnstilev1.RunTurnRequest
		code   codes.Code
		reason string
		// served is the model whose reply the turn got.
		served string
		msg    string
	}{
		{name: "no key", req: hello(), code: codes.Unauthenticated, reason: "UNAUTHENTICATED", msg: "Bearer"},
		{name: "wrong key", token: "tok-ops-0123456788", req: hello(), code: codes.Unauthenticated, reason: "UNAUTHENTICATED"},
		{name: "key of every model, default model", token: "tok-ops-0123456789", req: hello(), served: "a"},
		{name: "key of every model, model c", token: "tok-ops-0123456789", req: req("c"), served: "c"},
		{name: "restricted key, no model: its first", token: "tok-b-0123456789", req: hello(), served: "b"},
		{name: "restricted key, its model", token: "tok-b-0123456789", req: req("c"), served: "c"},
		{name: "restricted key, another model", token: "tok-b-0123456789", req: req("a"), code: codes.PermissionDenied, reason: "PERMISSION_DENIED", msg: `may not use model "a"`},
		{name: "restricted key, unknown model", token: "tok-b-0123456789", req: req("zz"), code: codes.InvalidArgument, reason: "INVALID_REQUEST", msg: "this client key may use: b, c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.token != "" {
				ctx = bearer(ctx, tt.token)
			}
			evs, st := wiretest.Collect(t, ctx, ts.client, tt.req, nil)
			if st.Code() != tt.code || reasonOf(st) != tt.reason || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("status %v %q reason %q; want %v %q containing %q", st.Code(), st.Message(), reasonOf(st), tt.code, tt.reason, tt.msg)
			}
			if tt.code != codes.OK {
				if len(evs) != 0 {
					t.Errorf("%d events before the refusal", len(evs))
				}
				return
			}
			if got := evs[0].GetTurnStarted().GetModel(); got != tt.served {
				t.Errorf("turn started on %q, want %q", got, tt.served)
			}
		})
	}
	if strings.Contains(logs.String(), "tok-") {
		t.Errorf("a token reached the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "client=team-b") {
		t.Errorf("the key's name is not on the RPC's log line:\n%s", logs.String())
	}
}

// TestHealthOpenReflectionKeyed: with keys, health still answers without
// one, reflection needs one, and reflection can be turned off.
func TestHealthOpenReflectionKeyed(t *testing.T) {
	t.Parallel()
	keys := []server.Key{keyed("ops", "tok-ops-0123456789")}
	ts := start(t, multiModel(t), server.Options{Keys: keys})
	if _, err := healthpb.NewHealthClient(ts.conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without a key: %v", err)
	}
	list := func(ctx context.Context, conn *grpc.ClientConn) error {
		rc, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		defer rc.CloseSend()
		// A Send the server refused says io.EOF; Recv then has the status.
		if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return err
		}
		_, err = rc.Recv()
		return err
	}
	if err := list(t.Context(), ts.conn); status.Code(err) != codes.Unauthenticated {
		t.Errorf("reflection without a key: %v", err)
	}
	if err := list(bearer(t.Context(), "tok-ops-0123456789"), ts.conn); err != nil {
		t.Errorf("reflection with a key: %v", err)
	}
	off := start(t, multiModel(t), server.Options{NoReflection: true})
	if err := list(t.Context(), off.conn); status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection turned off answered %v", err)
	}
}

// TestTurnRequestNamesClient: the runtime gets the key's name with the
// turn.
func TestTurnRequestNamesClient(t *testing.T) {
	t.Parallel()
	var got string
	obs := clientObserver{seen: func(c string) { got = c }}
	r, err := runtime.New([]*runtime.Model{{Alias: "m", Provider: fake.NewProvider(fake.Reply{Chunks: fake.Text("x")}), ID: "m", Retry: policy.DefaultRetry()}}, "m", nil, runtime.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, r, server.Options{Keys: []server.Key{keyed("billing-svc", "tok-0123456789")}})
	if _, st := wiretest.Collect(t, bearer(t.Context(), "tok-0123456789"), ts.client, hello(), nil); st.Code() != codes.OK {
		t.Fatal(st)
	}
	if got != "billing-svc" {
		t.Errorf("the turn's client is %q", got)
	}
}

type clientObserver struct {
	runtime.NopObserver
	seen func(string)
}

func (o clientObserver) TurnStart(ctx context.Context, info runtime.TurnInfo) context.Context {
	o.seen(info.Request.Client)
	return ctx
}
