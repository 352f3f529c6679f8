package runtime_test

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// timed is one scripted call of a timedProvider: its early chunks at once,
// then after delay its chunks, then err when set.
type timed struct {
	early  []llm.Chunk
	delay  time.Duration
	chunks []llm.Chunk
	err    error
}

// timedProvider answers call i with script[i] (the last repeats), waiting
// on the clock, so that on synctest's clock a test sets exactly which call
// answers first.
type timedProvider struct {
	script []timed
	mu     sync.Mutex
	calls  int
}

func (p *timedProvider) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	p.mu.Lock()
	s := p.script[min(p.calls, len(p.script)-1)]
	p.calls++
	p.mu.Unlock()
	return func(yield func(llm.Chunk, error) bool) {
		for _, c := range s.early {
			if !yield(c, nil) {
				return
			}
		}
		select {
		case <-ctx.Done():
			yield(llm.Chunk{}, ctx.Err())
			return
		case <-time.After(s.delay):
		}
		for _, c := range s.chunks {
			if !yield(c, nil) {
				return
			}
		}
		if s.err != nil {
			yield(llm.Chunk{}, s.err)
		}
	}
}

func (p *timedProvider) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// answer is a call that answers text after delay, having reported its
// input usage first (as Anthropic's message_start does).
func answer(delay time.Duration, text string) timed {
	return timed{early: []llm.Chunk{{Kind: llm.ChunkUsage, Usage: llm.Usage{InputTokens: 7}}}, delay: delay, chunks: fake.Text(text)}
}

// hedgeLog is an Observer that notes the hedge attributes of attempts.
type hedgeLog struct {
	runtime.NopObserver
	mu    sync.Mutex
	lines []string
}

func (h *hedgeLog) AttemptStart(ctx context.Context, a runtime.AttemptInfo) context.Context {
	if a.HedgeFrom != "" {
		h.mu.Lock()
		h.lines = append(h.lines, fmt.Sprintf("start %s#%d hedging %s after %v", a.Model, a.Attempt, a.HedgeFrom, a.HedgeAfter))
		h.mu.Unlock()
	}
	return ctx
}

func (h *hedgeLog) AttemptEnd(_ context.Context, a runtime.AttemptInfo, end runtime.AttemptEnd) {
	h.mu.Lock()
	defer h.mu.Unlock()
	outcome := "ok"
	if end.Err != nil {
		outcome = end.Err.Kind.String()
	}
	h.lines = append(h.lines, fmt.Sprintf("end %s#%d %s lost=%v input=%d", a.Model, a.Attempt, outcome, end.Lost, end.Usage.InputTokens))
}

func hedgeEvent(evs []runtime.Event) *runtime.Hedge {
	for _, ev := range evs {
		if h, ok := ev.Payload.(*runtime.Hedge); ok {
			return h
		}
	}
	return nil
}

// TestHedge runs a model hedged after 300ms against its fallback (or
// itself) on synctest's clock and asserts the events, which call's text was
// committed, and what the observer saw.
func TestHedge(t *testing.T) {
	const after = 300 * time.Millisecond
	tests := []struct {
		name    string
		to      runtime.HedgeTarget
		primary []timed
		backup  []timed
		setup   func(t *testing.T, r *runtime.Runner)
		events  string
		text    string
		log     string
	}{{
		name:    "the hedge answers first",
		primary: []timed{answer(3*time.Second, "slow")},
		backup:  []timed{answer(150*time.Millisecond, "fast")},
		events:  "start | call a#1 | hedge a>b | call b#1 | failed CANCELLED | usage | text | finished | usage | commit assistant | completed end_turn",
		text:    "fast",
		log:     "start b#1 hedging a after 300ms; end a#1 CANCELLED lost=true input=7; end b#1 ok lost=false input=10",
	}, {
		name:    "the primary answers before the delay: no hedge",
		primary: []timed{answer(200*time.Millisecond, "primary")},
		backup:  []timed{answer(150*time.Millisecond, "fast")},
		events:  "start | call a#1 | text | finished | usage | commit assistant | completed end_turn",
		text:    "primary",
		log:     "end a#1 ok lost=false input=10",
	}, {
		name:    "the primary answers after the hedge started, before it",
		primary: []timed{answer(400*time.Millisecond, "primary")},
		backup:  []timed{answer(time.Second, "late")},
		events:  "start | call a#1 | hedge a>b | call b#1 | failed CANCELLED | usage | text | finished | usage | commit assistant | completed end_turn",
		text:    "primary",
		log:     "start b#1 hedging a after 300ms; end b#1 CANCELLED lost=true input=7; end a#1 ok lost=false input=10",
	}, {
		name:    "the primary fails while the hedge runs",
		primary: []timed{{delay: 400 * time.Millisecond, err: providerErr(llm.KindOverloaded, 0)}},
		backup:  []timed{answer(time.Second, "backup")},
		events:  "start | call a#1 | hedge a>b | call b#1 | failed OVERLOADED | text | finished | usage | commit assistant | completed end_turn",
		text:    "backup",
		log:     "start b#1 hedging a after 300ms; end a#1 OVERLOADED lost=false input=0; end b#1 ok lost=false input=10",
	}, {
		name:    "the hedge fails, the primary answers",
		primary: []timed{answer(time.Second, "primary")},
		backup:  []timed{{delay: 100 * time.Millisecond, err: providerErr(llm.KindServerError, 0)}},
		events:  "start | call a#1 | hedge a>b | call b#1 | failed SERVER_ERROR | text | finished | usage | commit assistant | completed end_turn",
		text:    "primary",
		log:     "start b#1 hedging a after 300ms; end b#1 SERVER_ERROR lost=false input=0; end a#1 ok lost=false input=10",
	}, {
		name: "both fail: the primary's failure is decided on",
		primary: []timed{
			{delay: 400 * time.Millisecond, err: providerErr(llm.KindServerError, 0)},
			answer(100*time.Millisecond, "primary again"),
		},
		backup: []timed{{delay: 350 * time.Millisecond, err: providerErr(llm.KindServerError, 0)}},
		events: "start | call a#1 | hedge a>b | call b#1 | failed SERVER_ERROR | failed SERVER_ERROR | retry 2/3 SERVER_ERROR | call a#2 | text | finished | usage | commit assistant | completed end_turn",
		text:   "primary again",
		log:    "start b#1 hedging a after 300ms; end a#1 SERVER_ERROR lost=false input=0; end b#1 SERVER_ERROR lost=false input=0; end a#2 ok lost=false input=10",
	}, {
		name:    "to self",
		to:      runtime.HedgeSelf,
		primary: []timed{answer(3*time.Second, "slow"), answer(100*time.Millisecond, "replica")},
		events:  "start | call a#1 | hedge a>a | call a#2 | failed CANCELLED | usage | text | finished | usage | commit assistant | completed end_turn",
		text:    "replica",
		log:     "start a#2 hedging a after 300ms; end a#1 CANCELLED lost=true input=7; end a#2 ok lost=false input=10",
	}, {
		name:    "never to a model cooling down",
		primary: []timed{answer(time.Second, "primary")},
		backup:  []timed{answer(100*time.Millisecond, "fast")},
		setup: func(t *testing.T, r *runtime.Runner) {
			// A turn on b alone fails with auth and cools b down.
			run(t, t.Context(), r, &runtime.TurnRequest{TurnID: "cool", Model: "b", Messages: userTurn("x").Messages})
		},
		events: "start | call a#1 | text | finished | usage | commit assistant | completed end_turn",
		text:   "primary",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				primary := &timedProvider{script: tt.primary}
				a := model("a", primary)
				a.Hedge = &runtime.HedgeConfig{After: runtime.HedgeAfter(after), To: tt.to}
				models := []*runtime.Model{a}
				if tt.backup != nil {
					backup := &timedProvider{script: tt.backup}
					if tt.setup != nil {
						backup.script = append([]timed{{err: providerErr(llm.KindAuth, 0)}}, backup.script...)
					}
					a.Fallbacks = []string{"b"}
					models = append(models, model("b", backup))
				}
				obs := &hedgeLog{}
				r := newRunner(t, models, nil, runtime.WithObserver(obs))
				if tt.setup != nil {
					tt.setup(t, r)
					obs.lines = nil
				}
				evs, res, terr := run(t, t.Context(), r, userTurn("hi"))
				if terr != nil {
					t.Fatal(terr)
				}
				if got := describeAll(evs); got != tt.events {
					t.Errorf("events:\n got %s\nwant %s", got, tt.events)
				}
				if got := res.Messages[0].Text(); got != tt.text {
					t.Errorf("committed %q, want %q", got, tt.text)
				}
				if got := shownText(evs); got != tt.text {
					t.Errorf("shown %q, want %q: the loser's output leaked", got, tt.text)
				}
				if h := hedgeEvent(evs); h != nil && h.After != after {
					t.Errorf("hedge after %v, want %v", h.After, after)
				}
				if tt.log != "" {
					if got := strings.Join(obs.lines, "; "); got != tt.log {
						t.Errorf("observer:\n got %s\nwant %s", got, tt.log)
					}
				}
			})
		})
	}
}

// TestHedgeWinnerMovesTheTurn: a hedge to the next model that answers
// first moves the turn to that model, as a fallback would: its next step
// starts there.
func TestHedgeWinnerMovesTheTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		primary := &timedProvider{script: []timed{{delay: 3 * time.Second, chunks: fake.Call("c1", "lookup", "{}")}}}
		backup := &timedProvider{script: []timed{{delay: 100 * time.Millisecond, chunks: fake.Call("c1", "lookup", "{}")}, answer(100*time.Millisecond, "done")}}
		a := model("a", primary, "b")
		a.Hedge = &runtime.HedgeConfig{After: runtime.HedgeAfter(300 * time.Millisecond)}
		r := newRunner(t, []*runtime.Model{a, model("b", backup)}, []llm.Tool{fake.NewTool("lookup", nil)})
		evs, _, terr := run(t, t.Context(), r, userTurn("hi"))
		if terr != nil {
			t.Fatal(terr)
		}
		want := "start | call a#1 | hedge a>b | call b#1 | failed CANCELLED | tooldelta | finished | usage | commit assistant | tool lookup | tooldone lookup | commit tool | call b#1 | text | finished | usage | commit assistant | completed end_turn"
		if got := describeAll(evs); got != want {
			t.Errorf("events:\n got %s\nwant %s", got, want)
		}
		if primary.Calls() != 1 {
			t.Errorf("the primary got %d calls, want 1", primary.Calls())
		}
	})
}

// TestHedgeLimits: no hedge when the target's retry budget has no token,
// or when the turn has no model call left.
func TestHedgeLimits(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(a, b *runtime.Model)
		limits func(*runtime.Limits)
	}{
		{"the target's budget has no token", func(_, b *runtime.Model) { b.Retry.BudgetTokens = 0.5 }, nil},
		{"the turn has no call left", func(*runtime.Model, *runtime.Model) {}, func(l *runtime.Limits) { l.MaxModelCalls = 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				backup := &timedProvider{script: []timed{answer(100*time.Millisecond, "fast")}}
				a := model("a", &timedProvider{script: []timed{answer(time.Second, "primary")}}, "b")
				a.Hedge = &runtime.HedgeConfig{After: runtime.HedgeAfter(300 * time.Millisecond)}
				b := model("b", backup)
				tt.edit(a, b)
				var opts []runtime.Option
				if tt.limits != nil {
					opts = append(opts, withLimits(tt.limits))
				}
				r := newRunner(t, []*runtime.Model{a, b}, nil, opts...)
				evs, _, _ := run(t, t.Context(), r, userTurn("hi"))
				if got, want := describeAll(evs), "start | call a#1 | text | finished | usage | commit assistant | completed end_turn"; got != want {
					t.Errorf("events:\n got %s\nwant %s", got, want)
				}
				if backup.Calls() != 0 {
					t.Errorf("the target got %d calls", backup.Calls())
				}
			})
		})
	}
}

// TestHedgeAtQuantile: a model hedging at p95 of its observed time to first
// chunk is not hedged until 20 calls are seen; then a call slower than the
// 95th percentile of them is.
func TestHedgeAtQuantile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		script := make([]timed, 0, 22)
		for i := range 20 {
			script = append(script, answer(time.Duration(100+i*10)*time.Millisecond, "ok")) // 100ms..290ms
		}
		script = append(script, answer(time.Second, "slow"))
		primary := &timedProvider{script: script}
		backup := &timedProvider{script: []timed{answer(50*time.Millisecond, "hedged")}}
		a := model("a", primary, "b")
		a.Hedge = &runtime.HedgeConfig{After: runtime.HedgeQuantile(0.95)}
		r := newRunner(t, []*runtime.Model{a, model("b", backup)}, nil)
		for i := range 20 {
			evs, _, _ := run(t, t.Context(), r, userTurn("hi"))
			if h := hedgeEvent(evs); h != nil {
				t.Fatalf("turn %d hedged after %v with fewer than 20 samples", i+1, h.After)
			}
		}
		evs, res, _ := run(t, t.Context(), r, userTurn("hi"))
		h := hedgeEvent(evs)
		if h == nil || res.Messages[0].Text() != "hedged" {
			t.Fatalf("the slow call was not hedged: %s", describeAll(evs))
		}
		// Nearest rank: the 19th of the 20 samples, 100ms + 18*10ms.
		if h.After != 280*time.Millisecond {
			t.Errorf("hedged after %v, want p95 = 280ms", h.After)
		}
	})
}
