package bench

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestSmoke builds the turnstile binary and runs the whole bench on a few
// turns: every phase must complete without errors and the report must
// hold every figure. The real measurement is `turnstile bench`.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	defer goleak.VerifyNone(t)
	bin := buildTurnstile(t)
	for _, tt := range []struct {
		name   string
		config string
		tls    bool
	}{{"one model", DefaultConfig, false}, {"chain", ChainConfig, false}, {"one model, HTTP/2 upstream", DefaultConfig, true}} {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Run(t.Context(), Config{
				Binary: bin, ServerConfig: tt.config,
				Upstream: UpstreamConfig{Chunks: 5, SlowDelay: 100 * time.Millisecond, TLS: tt.tls},
				Turns:    20, ConcurrentTurns: 40, Concurrency: 4, Warmup: 5, Slow: 10,
				Settle: 50 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Servers) != 2 || rep.Servers[0].Store != "on" || rep.Servers[1].Store != "off" {
				t.Fatalf("servers %+v: want the store on, then off", rep.Servers)
			}
			for _, p := range []Phase{rep.DirectSeq, rep.DirectConc} {
				if p.Errors != 0 || p.Turns == 0 || p.FirstDeltaP50 <= 0 || p.TotalP99 < p.FirstDeltaP50 {
					t.Errorf("phase %+v: want turns, no errors and sane latencies", p)
				}
			}
			for _, s := range rep.Servers {
				for _, p := range []Phase{s.ServerSeq, s.ServerConc, s.FastUnderSlow} {
					if p.Errors != 0 || p.Turns == 0 || p.FirstDeltaP50 <= 0 || p.TotalP99 < p.FirstDeltaP50 {
						t.Errorf("store %s: phase %+v: want turns, no errors and sane latencies", s.Store, p)
					}
				}
				if s.ServerSeq.CPUPerTurn < 0 || s.ServerSeq.AllocsPerTurn <= 0 || s.IdleRSS <= 0 || s.SlowOpen != 10 {
					t.Errorf("store %s: report %+v: want server figures and 10 slow turns open", s.Store, s)
				}
			}
			// The server reaches the upstream with the protocol asked:
			// over TLS, trusting its certificate, every request on HTTP/2.
			if want := map[bool]int64{false: 0, true: rep.UpstreamRequests}[tt.tls]; rep.UpstreamRequests == 0 || rep.UpstreamHTTP2 != want {
				t.Errorf("upstream requests %d, %d over HTTP/2: want %d", rep.UpstreamRequests, rep.UpstreamHTTP2, want)
			}
			for _, s := range rep.Servers {
				if s.SlowStackPerTurn == 0 && s.SlowHeapPerTurn == 0 {
					t.Errorf("store %s: slow turns' heap %d and stacks %d per turn: want them read", s.Store, s.SlowHeapPerTurn, s.SlowStackPerTurn)
				}
			}
			var out bytes.Buffer
			rep.Write(&out)
			for _, want := range []string{"| turnstile, sequential, store on |", "| turnstile, sequential, store off |", "| direct, c=4 |",
				"store on: idle RSS", "store on: slow turns: 10 held open", "store off: slow turns: 10 held open",
				"| target | measured | met |", "upstream: " + rep.Config.Upstream.Mode() + ",", "of which, per slow turn: heap in use", "| store on: server CPU per turn ≤ 1.2 × store off (sequential) |"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// buildTurnstile builds the turnstile binary into the test's directory.
func buildTurnstile(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "turnstile")
	build := exec.Command("go", "build", "-o", bin, "github.com/turnstile-dev/turnstile/cmd/turnstile")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestSmokePacedShapes runs the bench on a few turns of a paced upstream
// with every shape: the store on, off, and two servers on a NATS cluster
// of three servers the bench starts as processes. Each shape reports the
// CPU time of each of its processes, and the shapes with a store the
// messages a turn stores; the report lists issue #35's targets.
func TestSmokePacedShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	defer goleak.VerifyNone(t)
	bin := buildTurnstile(t)
	rep, err := Run(t.Context(), Config{
		Binary: bin, Stores: []string{"on", "off", "cluster"},
		Upstream: UpstreamConfig{Chunks: 5, Delay: 2 * time.Millisecond},
		Turns:    5, ConcurrentTurns: 20, Concurrency: 4, Warmup: 2,
		Settle: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"on":      {"turnstile"},
		"off":     {"turnstile"},
		"cluster": {"turnstile 1", "turnstile 2", "nats n0", "nats n1", "nats n2"},
	}
	if len(rep.Servers) != 3 {
		t.Fatalf("%d shapes, want 3", len(rep.Servers))
	}
	for _, s := range rep.Servers {
		for _, p := range []Phase{s.ServerSeq, s.ServerConc} {
			if p.Errors != 0 || p.Turns == 0 {
				t.Errorf("store %s: phase %+v: want turns and no errors", s.Store, p)
			}
			var names []string
			var sum time.Duration
			for _, pc := range p.Processes {
				names = append(names, pc.Name)
				sum += pc.CPUPerTurn
			}
			if strings.Join(names, ",") != strings.Join(want[s.Store], ",") || sum != p.CPUPerTurn {
				t.Errorf("store %s: processes %+v, CPU per turn %v: want %v, summed", s.Store, p.Processes, p.CPUPerTurn, want[s.Store])
			}
			// The NATS servers the bench started count their messages.
			if cluster := s.Store == "cluster"; cluster != (p.NATSInPerTurn > 0 && p.NATSOutPerTurn > 0) {
				t.Errorf("store %s: NATS messages per turn %.1f in, %.1f out", s.Store, p.NATSInPerTurn, p.NATSOutPerTurn)
			}
			// Each turn stores its record and at least one frame.
			if stores := s.Store != "off"; stores && p.StoredPerTurn < 2 || !stores && p.StoredPerTurn != 0 {
				t.Errorf("store %s: %.1f stored messages per turn", s.Store, p.StoredPerTurn)
			}
		}
	}
	var out bytes.Buffer
	rep.Write(&out)
	for _, want := range []string{"| turnstile, c=4, store cluster |", "store cluster, c=4: CPU per turn by process: turnstile 1 ",
		"| cluster: stored messages per turn ≤ 25 (c=4) |", "store cluster, c=4: NATS messages per turn, summed over its servers: ", "| store on: CPU per turn of every process of the shape ≤ 1.3 × store off (c=4) |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestUpstreamTLS checks the upstream's HTTPS mode: a client that trusts
// its certificate streams a reply over HTTP/2, one that does not is
// refused by certificate verification, and Close removes the certificate.
func TestUpstreamTLS(t *testing.T) {
	defer goleak.VerifyNone(t)
	up, err := StartUpstream(UpstreamConfig{Chunks: 2, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(up.URL, "https://127.0.0.1:") || up.Roots == nil {
		t.Fatalf("URL %q, roots %v: want https on loopback and a pool", up.URL, up.Roots)
	}
	if pemBytes, err := os.ReadFile(up.CAFile); err != nil || !strings.HasPrefix(string(pemBytes), "-----BEGIN CERTIFICATE-----") {
		t.Fatalf("CA file %s: %v %q", up.CAFile, err, pemBytes)
	}
	trusted := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: up.Roots}, ForceAttemptHTTP2: true}
	defer trusted.CloseIdleConnections()
	s, err := directTurn(&http.Client{Transport: trusted}, up.URL)(t.Context())
	if err != nil || s.firstDelta <= 0 {
		t.Fatalf("trusted client: %+v, %v: want a reply", s, err)
	}
	if up.Requests() != 1 || up.HTTP2Requests() != 1 {
		t.Errorf("requests %d, over HTTP/2 %d: want 1 and 1", up.Requests(), up.HTTP2Requests())
	}
	untrusted := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}
	defer untrusted.CloseIdleConnections()
	_, err = directTurn(&http.Client{Transport: untrusted}, up.URL)(t.Context())
	if verr := (*tls.CertificateVerificationError)(nil); !errors.As(err, &verr) {
		t.Errorf("untrusted client: %v: want a certificate verification error", err)
	}
	if err := up.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(up.CAFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CA file after Close: %v: want it gone", err)
	}
}
