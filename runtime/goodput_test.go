package runtime_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"iter"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// The goodput tests load a runner with turns from concurrent clients
// against upstreams that fail or stall on a schedule, on synctest's
// simulated clock: minutes of simulated traffic run in well under a second,
// and every delay (backoffs, latencies, hedge timers) is exact.

// upstream is a simulated provider. Each call answers after ttft with a
// short reply, or fails after failAfter with a 529, as fails decides from
// the simulated time, the turn and the call's number within the turn (from
// 1). Its draws are a hash of the turn and call number, so a turn meets the
// same faults whatever the goroutines' order.
type upstream struct {
	name      string
	fails     func(now time.Time, turn string, n int) bool
	failAfter time.Duration
	ttft      func(turn string, n int) time.Duration

	mu      sync.Mutex
	perTurn map[string]int
	calls   int
}

func (u *upstream) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		u.mu.Lock()
		if u.perTurn == nil {
			u.perTurn = map[string]int{}
		}
		u.perTurn[req.TurnID]++
		n := u.perTurn[req.TurnID]
		u.calls++
		u.mu.Unlock()
		sleep := func(d time.Duration) bool {
			select {
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return false
			case <-time.After(d):
				return true
			}
		}
		if u.fails(time.Now(), req.TurnID, n) {
			if sleep(u.failAfter) {
				yield(llm.Chunk{}, &llm.Error{Kind: llm.KindOverloaded, StatusCode: 529, Message: "Overloaded", Provider: u.name})
			}
			return
		}
		if !sleep(u.ttft(req.TurnID, n)) {
			return
		}
		for _, c := range []llm.Chunk{
			{Kind: llm.ChunkText, Text: "the answer"},
			{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 10, OutputTokens: 2}},
			{Kind: llm.ChunkStop, Stop: llm.StopEndTurn},
		} {
			if !yield(c, nil) {
				return
			}
		}
	}
}

func (u *upstream) Calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls
}

// draw returns a uniform draw in [0, 1) fixed by the turn and call number.
func draw(turn string, n int) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", turn, n)
	// FNV mixes the last bytes into the high bits poorly: finish with
	// splitmix64's mixer.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

func fixed(d time.Duration) func(string, int) time.Duration {
	return func(string, int) time.Duration { return d }
}

// turnRecord is how one turn went.
type turnRecord struct {
	id    string
	start time.Time
	calls int
	ok    bool
	// ttfo is the time to the turn's first output, zero when none.
	ttfo time.Duration
}

// recordTurns is an Observer that keeps a record per turn.
type recordTurns struct {
	runtime.NopObserver
	mu      sync.Mutex
	records []turnRecord
}

func (o *recordTurns) TurnEnd(_ context.Context, t runtime.TurnInfo, end runtime.TurnEnd) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.records = append(o.records, turnRecord{id: t.TurnID, start: t.Start, calls: end.Counters.ModelCalls, ok: end.Completed != nil, ttfo: end.TimeToFirstOutput})
}

// load runs turns from workers concurrent clients, each starting its next
// turn as soon as its last ended, until more returns false for the turn's
// number (from 0) at the simulated time it would start. It returns a
// record of every turn.
func load(r *runtime.Runner, workers int, more func(i int, now time.Time) bool) []turnRecord {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if !more(i, time.Now()) {
					return
				}
				req := &runtime.TurnRequest{TurnID: fmt.Sprintf("turn-%d", i), Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}}}
				_, _ = r.Run(context.Background(), req, runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil }))
			}
		})
	}
	wg.Wait()
	return nil
}

// goodputRunner builds a runner over models with the default retry policy
// and a seeded jitter, observed by obs.
func goodputRunner(t *testing.T, obs runtime.Observer, models ...*runtime.Model) *runtime.Runner {
	t.Helper()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 11))
	jitter := func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64()
	}
	for _, m := range models {
		m.Retry = policy.DefaultRetry()
	}
	r, err := runtime.New(models, models[0].Alias, nil, runtime.WithObserver(obs), runtime.WithJitter(jitter))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// summary sums up records: turns, the share that completed, and model
// calls per turn.
func summary(records []turnRecord) (turns int, completed, callsPerTurn float64) {
	calls, ok := 0, 0
	for _, r := range records {
		calls += r.calls
		if r.ok {
			ok++
		}
	}
	if len(records) == 0 {
		return 0, 0, 0
	}
	return len(records), float64(ok) / float64(len(records)), float64(calls) / float64(len(records))
}

func between(records []turnRecord, from, to time.Time) []turnRecord {
	var out []turnRecord
	for _, r := range records {
		if !r.start.Before(from) && r.start.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// TestGoodputRandomFaults: one model failing 30% of calls at random, no
// fallback, max_retries 2, 1,000 turns from 10 concurrent clients. Three
// attempts fail 2.7% of turns; the budget must keep the retries, which
// work 70% of the time: at least 96.5% of turns complete, with at most 1.45
// calls per turn (1 + 0.3 + 0.09 = 1.39 expected).
func TestGoodputRandomFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &upstream{
			name:      "flaky",
			fails:     func(_ time.Time, turn string, n int) bool { return draw(turn, n) < 0.3 },
			failAfter: 50 * time.Millisecond,
			ttft:      fixed(200 * time.Millisecond),
		}
		obs := &recordTurns{}
		r := goodputRunner(t, obs, &runtime.Model{Alias: "m", ProviderName: "flaky", Provider: u, ID: "m-1"})
		load(r, 10, func(i int, _ time.Time) bool { return i < 1000 })
		turns, completed, perTurn := summary(obs.records)
		t.Logf("%d turns: %.1f%% completed, %.3f calls per turn", turns, completed*100, perTurn)
		if turns != 1000 || completed < 0.965 || perTurn > 1.45 {
			t.Errorf("%d turns: %.1f%% completed, %.3f calls per turn; want 1000, at least 96.5%%, at most 1.45", turns, completed*100, perTurn)
		}
	})
}

// TestGoodputOutage: the same load, the provider down (every call fails)
// for 10s between stretches of 30% random faults. From a second into the
// outage, turns make at most 1.2 calls each (the budget stops retries that
// keep failing); after it, turns complete again at once, and from a second
// after it at the healthy rate (the refill's probes find the model back).
func TestGoodputOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		down, up := t0.Add(5*time.Second), t0.Add(15*time.Second)
		u := &upstream{
			name: "flaky",
			fails: func(now time.Time, turn string, n int) bool {
				return !now.Before(down) && now.Before(up) || draw(turn, n) < 0.3
			},
			failAfter: 50 * time.Millisecond,
			ttft:      fixed(200 * time.Millisecond),
		}
		obs := &recordTurns{}
		r := goodputRunner(t, obs, &runtime.Model{Alias: "m", ProviderName: "flaky", Provider: u, ID: "m-1"})
		load(r, 10, func(_ int, now time.Time) bool { return now.Before(t0.Add(25 * time.Second)) })

		slices.SortFunc(obs.records, func(a, b turnRecord) int { return a.start.Compare(b.start) })
		report := func(name string, from, to time.Time) (int, float64, float64) {
			n, c, p := summary(between(obs.records, from, to))
			t.Logf("%-28s %5d turns, %5.1f%% completed, %.3f calls per turn", name, n, c*100, p)
			return n, c, p
		}
		report("before the outage", t0, down)
		report("first second of the outage", down, down.Add(time.Second))
		if n, _, p := report("rest of the outage", down.Add(time.Second), up); n == 0 || p > 1.2 {
			t.Errorf("after the outage's first second: %.3f calls per turn over %d turns, want at most 1.2", p, n)
		}
		report("first second after it", up, up.Add(time.Second))
		// After the outage, a turn can complete unless its three draws all
		// fail: the budget must have let the retries of all but a couple of
		// those turns through, starting a second after the model is back.
		after := between(obs.records, up.Add(time.Second), t0.Add(25*time.Second))
		n, completed, _ := report("from a second after it", up.Add(time.Second), t0.Add(25*time.Second))
		possible := 0
		for _, rec := range after {
			if draw(rec.id, 1) >= 0.3 || draw(rec.id, 2) >= 0.3 || draw(rec.id, 3) >= 0.3 {
				possible++
			}
		}
		lost := possible - int(completed*float64(n)+0.5)
		t.Logf("%d of those turns could complete with every retry allowed: %d lost", possible, lost)
		if n == 0 || lost > 2 {
			t.Errorf("from a second after the outage: %d of %d turns completed, %d could: the budget lost %d", int(completed*float64(n)+0.5), n, possible, lost)
		}
		var first time.Time
		for _, rec := range obs.records {
			if rec.ok && !rec.start.Before(up) {
				first = rec.start
				break
			}
		}
		if first.IsZero() || first.Sub(up) > time.Second {
			t.Errorf("the first turn to complete after the outage started %v after it, want within 1s", first.Sub(up))
		}
	})
}

// TestGoodputDeadPrimary: a chain of three models with the primary down:
// every turn completes on a fallback, with at most 1.1 calls to the
// primary per turn (the budget and the primary's cooldown keep turns off
// it).
func TestGoodputDeadPrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dead := &upstream{name: "dead", fails: func(time.Time, string, int) bool { return true }, failAfter: 50 * time.Millisecond, ttft: fixed(0)}
		healthy := func(name string) *upstream {
			return &upstream{name: name, fails: func(time.Time, string, int) bool { return false }, ttft: fixed(200 * time.Millisecond)}
		}
		b, c := healthy("b"), healthy("c")
		obs := &recordTurns{}
		r := goodputRunner(t, obs,
			&runtime.Model{Alias: "a", ProviderName: "dead", Provider: dead, ID: "a-1", Fallbacks: []string{"b", "c"}},
			&runtime.Model{Alias: "b", ProviderName: "b", Provider: b, ID: "b-1"},
			&runtime.Model{Alias: "c", ProviderName: "c", Provider: c, ID: "c-1"},
		)
		load(r, 10, func(i int, _ time.Time) bool { return i < 1000 })
		turns, completed, _ := summary(obs.records)
		perTurn := float64(dead.Calls()) / float64(turns)
		t.Logf("%d turns: %.1f%% completed; %d calls to the dead primary (%.3f per turn), %d to b, %d to c",
			turns, completed*100, dead.Calls(), perTurn, b.Calls(), c.Calls())
		if turns != 1000 || completed != 1 || perTurn > 1.1 {
			t.Errorf("%d turns, %.1f%% completed, %.3f primary calls per turn; want 1000, all, at most 1.1", turns, completed*100, perTurn)
		}
	})
}

// TestGoodputHedgedFirstToken: a primary whose first token takes 3s on
// every tenth call (else 100-200ms), a healthy fallback answering in 150ms, and a
// hedge after 300ms to the fallback. The 99th percentile of the turns'
// time to first output stays within the hedge delay + the fallback's
// 150ms + 50ms, for at most 12% more upstream calls.
func TestGoodputHedgedFirstToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const after = 300 * time.Millisecond
		never := func(time.Time, string, int) bool { return false }
		primary := &upstream{name: "primary", fails: never, ttft: func(turn string, n int) time.Duration {
			var i int
			fmt.Sscanf(turn, "turn-%d", &i)
			if i%10 == 0 {
				return 3 * time.Second // one call in ten
			}
			return 100*time.Millisecond + time.Duration(draw(turn, n)*float64(100*time.Millisecond))
		}}
		fallback := &upstream{name: "fallback", fails: never, ttft: fixed(150 * time.Millisecond)}
		obs := &recordTurns{}
		r := goodputRunner(t, obs,
			&runtime.Model{Alias: "a", ProviderName: "primary", Provider: primary, ID: "a-1", Fallbacks: []string{"b"},
				Hedge: &runtime.HedgeConfig{After: runtime.HedgeAfter(after)}},
			&runtime.Model{Alias: "b", ProviderName: "fallback", Provider: fallback, ID: "b-1"},
		)
		load(r, 10, func(i int, _ time.Time) bool { return i < 1000 })
		turns, completed, _ := summary(obs.records)
		ttfo := make([]time.Duration, 0, len(obs.records))
		for _, rec := range obs.records {
			ttfo = append(ttfo, rec.ttfo)
		}
		slices.Sort(ttfo)
		p50, p99 := ttfo[len(ttfo)/2], ttfo[len(ttfo)*99/100]
		extra := float64(primary.Calls()+fallback.Calls()-turns) / float64(turns)
		t.Logf("%d turns, %.1f%% completed: time to first output p50 %v, p99 %v, max %v; %d primary and %d fallback calls (%.1f%% extra)",
			turns, completed*100, p50, p99, ttfo[len(ttfo)-1], primary.Calls(), fallback.Calls(), extra*100)
		if limit := after + 150*time.Millisecond + 50*time.Millisecond; turns != 1000 || completed != 1 || p99 > limit || extra > 0.12 {
			t.Errorf("p99 %v (limit %v), %.1f%% extra calls (limit 12%%), %d turns, %.1f%% completed", p99, limit, extra*100, turns, completed*100)
		}
	})
}
