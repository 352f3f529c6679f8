package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// BenchmarkGoodput measures the goodput targets on the whole server
// as `turnstile serve` builds it from a configuration (the real OpenAI
// adapter, the real gRPC server on loopback), against fake
// OpenAI-compatible APIs on loopback that fail or stall at random, in real
// time, from 10 concurrent clients. Each sub-benchmark is one scenario and
// takes 10 to 40 seconds; run them once:
//
//	go test -run XXX -bench Goodput -benchtime 1x ./cmd/turnstile
//
// The figures are reported as benchmark metrics; BENCHMARKS.md records
// them. runtime/goodput_test.go holds the same targets as fast tests on a
// simulated clock.
func BenchmarkGoodput(b *testing.B) {
	b.Run("random-faults", func(b *testing.B) { benchRandomFaults(b, "") })
	b.Run("random-faults-no-budget", func(b *testing.B) { benchRandomFaults(b, "retry: {budget_tokens: 0}\n") })
	b.Run("outage", benchOutage)
	b.Run("dead-primary", benchDeadPrimary)
	b.Run("hedged-first-token", benchHedge)
}

// verdict is how a fake API answers one call: after wait, an error with
// status (0: a streamed answer).
type verdict struct {
	status int
	wait   time.Duration
}

// faultyAPI is an OpenAI-compatible Chat Completions API on loopback whose
// calls go as decide says.
type faultyAPI struct {
	*httptest.Server
	calls atomic.Int64
}

func newFaultyAPI(tb testing.TB, decide func(now time.Time) verdict) *faultyAPI {
	tb.Helper()
	api := &faultyAPI{}
	api.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		api.calls.Add(1)
		v := decide(time.Now())
		select {
		case <-r.Context().Done():
			return
		case <-time.After(v.wait):
		}
		switch v.status {
		case 0:
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, openaiAnswer("The answer."))
		case http.StatusServiceUnavailable:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(v.status)
			_, _ = io.WriteString(w, `{"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":"server_is_overloaded"}}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(v.status)
			_, _ = io.WriteString(w, `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`)
		}
	}))
	tb.Cleanup(api.Close)
	return api
}

// chance reports true with probability p.
func chance(p float64) bool { return rand.Float64() < p }

// benchTurn is how one turn went, seen by its client.
type benchTurn struct {
	start time.Time
	ok    bool
	// ttft is the time from the call to the first text delta, zero when
	// none came.
	ttft time.Duration
}

// drive runs turns from 10 concurrent clients against w until more
// returns false for the turn's number at the time it would start.
func drive(tb testing.TB, w *wired, more func(i int, now time.Time) bool) []benchTurn {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		turns []benchTurn
		wg    sync.WaitGroup
	)
	for range 10 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				start := time.Now()
				if !more(i, start) {
					return
				}
				bt := benchTurn{start: start}
				req := &turnstilev1.RunTurnRequest{Messages: wiretest.UserText("What is the answer?")}
				_, st := wiretest.Collect(tb, context.Background(), w.client, req, func(ev *turnstilev1.AgentEvent) {
					if ev.GetTextDelta() != nil && bt.ttft == 0 {
						bt.ttft = time.Since(start)
					}
				})
				bt.ok = st.Err() == nil
				mu.Lock()
				turns = append(turns, bt)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(turns, func(a, b benchTurn) int { return a.start.Compare(b.start) })
	return turns
}

func completedShare(turns []benchTurn) float64 {
	ok := 0
	for _, t := range turns {
		if t.ok {
			ok++
		}
	}
	return float64(ok) / float64(max(len(turns), 1))
}

func startedBetween(turns []benchTurn, from, to time.Time) []benchTurn {
	var out []benchTurn
	for _, t := range turns {
		if !t.start.Before(from) && t.start.Before(to) {
			out = append(out, t)
		}
	}
	return out
}

// goodputYAML configures models aliased a, b, c... on the APIs given, the
// first with the others as fallbacks, with the default retry policy.
func goodputYAML(b *testing.B, extra string, apis ...*faultyAPI) string {
	b.Setenv("GOODPUT_KEY", "test-key-0123456789")
	var p, m strings.Builder
	var aliases []string
	for i, api := range apis {
		alias := string(rune('a' + i))
		aliases = append(aliases, alias)
		fmt.Fprintf(&p, "  %s: {type: openai, base_url: %s, api_key_env: GOODPUT_KEY}\n", alias, api.URL)
	}
	for i, alias := range aliases {
		fmt.Fprintf(&m, "  %s: {provider: %s, model: gpt-4.1-mini", alias, alias)
		if i == 0 && len(aliases) > 1 {
			fmt.Fprintf(&m, ", fallbacks: [%s]%s", strings.Join(aliases[1:], ", "), extra)
		}
		m.WriteString("}\n")
	}
	return "providers:\n" + p.String() + "models:\n" + m.String() + "default_model: a\n"
}

// benchRandomFaults: one model failing 30% of calls (503 overloaded) at
// random, 1,000 turns: completed share (the limit is 97.3%), upstream calls
// per turn, and the share of calls that failed. retry, when set, is the
// configuration's retry block (the no-budget comparison).
func benchRandomFaults(b *testing.B, retry string) {
	for range b.N {
		var failed atomic.Int64
		api := newFaultyAPI(b, func(time.Time) verdict {
			if chance(0.3) {
				failed.Add(1)
				return verdict{status: http.StatusServiceUnavailable, wait: 20 * time.Millisecond}
			}
			return verdict{wait: 100 * time.Millisecond}
		})
		w := serveYAML(b, goodputYAML(b, "", api)+retry)
		turns := drive(b, w, func(i int, _ time.Time) bool { return i < 1000 })
		b.ReportMetric(100*completedShare(turns), "%completed")
		b.ReportMetric(float64(api.calls.Load())/float64(len(turns)), "calls/turn")
		b.ReportMetric(100*float64(failed.Load())/float64(api.calls.Load()), "%calls-failed")
	}
}

// benchOutage: the same load, the API down (500 on every call) from 5s to
// 15s into a 25s run: upstream calls per turn for the turns started from a
// second into the outage to its end, the completed share of the turns
// started from a second after it, and how long after it the first turn
// that completed started.
func benchOutage(b *testing.B) {
	for range b.N {
		t0 := time.Now()
		down, up := t0.Add(5*time.Second), t0.Add(15*time.Second)
		var outageCalls atomic.Int64
		api := newFaultyAPI(b, func(now time.Time) verdict {
			if !now.Before(down.Add(time.Second)) && now.Before(up) {
				outageCalls.Add(1)
			}
			switch {
			case !now.Before(down) && now.Before(up):
				return verdict{status: http.StatusInternalServerError, wait: 20 * time.Millisecond}
			case chance(0.3):
				return verdict{status: http.StatusServiceUnavailable, wait: 20 * time.Millisecond}
			}
			return verdict{wait: 100 * time.Millisecond}
		})
		w := serveYAML(b, goodputYAML(b, "", api))
		turns := drive(b, w, func(_ int, now time.Time) bool { return now.Before(t0.Add(25 * time.Second)) })
		during := startedBetween(turns, down.Add(time.Second), up)
		b.ReportMetric(float64(outageCalls.Load())/float64(max(len(during), 1)), "outage-calls/turn")
		b.ReportMetric(100*completedShare(startedBetween(turns, up.Add(time.Second), t0.Add(25*time.Second))), "%completed-after")
		for _, t := range startedBetween(turns, up, t0.Add(25*time.Second)) {
			if t.ok {
				b.ReportMetric(float64(t.start.Sub(up).Milliseconds()), "ms-to-first-success")
				break
			}
		}
	}
}

// benchDeadPrimary: a chain of three models with the primary down (500),
// 1,000 turns: completed share and calls to the primary per turn.
func benchDeadPrimary(b *testing.B) {
	for range b.N {
		dead := newFaultyAPI(b, func(time.Time) verdict {
			return verdict{status: http.StatusInternalServerError, wait: 20 * time.Millisecond}
		})
		healthy := func(time.Time) verdict { return verdict{wait: 100 * time.Millisecond} }
		w := serveYAML(b, goodputYAML(b, "", dead, newFaultyAPI(b, healthy), newFaultyAPI(b, healthy)))
		turns := drive(b, w, func(i int, _ time.Time) bool { return i < 1000 })
		b.ReportMetric(100*completedShare(turns), "%completed")
		b.ReportMetric(float64(dead.calls.Load())/float64(len(turns)), "primary-calls/turn")
	}
}

// benchHedge: a primary whose first token takes 3s on 10% of calls (else
// 100-200ms), a fallback answering in 150ms, a hedge after 300ms to the
// fallback, 1,000 turns: the clients' time to first token (p50, p99; the
// target is p99 ≤ 300 + 150 + 50ms) and the extra upstream calls.
func benchHedge(b *testing.B) {
	for range b.N {
		primary := newFaultyAPI(b, func(time.Time) verdict {
			if chance(0.1) {
				return verdict{wait: 3 * time.Second}
			}
			return verdict{wait: 100*time.Millisecond + rand.N(100*time.Millisecond)}
		})
		fallback := newFaultyAPI(b, func(time.Time) verdict { return verdict{wait: 150 * time.Millisecond} })
		w := serveYAML(b, goodputYAML(b, ", hedge: {after: 300ms}", primary, fallback))
		turns := drive(b, w, func(i int, _ time.Time) bool { return i < 1000 })
		ttft := make([]time.Duration, 0, len(turns))
		for _, t := range turns {
			ttft = append(ttft, t.ttft)
		}
		slices.Sort(ttft)
		b.ReportMetric(100*completedShare(turns), "%completed")
		b.ReportMetric(float64(ttft[len(ttft)/2].Microseconds())/1000, "p50-ttft-ms")
		b.ReportMetric(float64(ttft[len(ttft)*99/100].Microseconds())/1000, "p99-ttft-ms")
		b.ReportMetric(100*float64(primary.calls.Load()+fallback.calls.Load()-int64(len(turns)))/float64(len(turns)), "%extra-calls")
	}
}
