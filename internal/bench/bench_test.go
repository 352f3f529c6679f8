package bench

import (
	"bytes"
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
	bin := filepath.Join(t.TempDir(), "turnstile")
	build := exec.Command("go", "build", "-o", bin, "github.com/turnstile-dev/turnstile/cmd/turnstile")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tt := range []struct {
		name   string
		config string
	}{{"one model", DefaultConfig}, {"chain", ChainConfig}} {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Run(t.Context(), Config{
				Binary: bin, ServerConfig: tt.config,
				Upstream: UpstreamConfig{Chunks: 5, SlowDelay: 100 * time.Millisecond},
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
			var out bytes.Buffer
			rep.Write(&out)
			for _, want := range []string{"| turnstile, sequential, store on |", "| turnstile, sequential, store off |", "| direct, c=4 |",
				"store on: idle RSS", "store on: slow turns: 10 held open", "store off: slow turns: 10 held open",
				"| target | measured | met |", "| store on: server CPU per turn ≤ 1.2 × store off (sequential) |"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
