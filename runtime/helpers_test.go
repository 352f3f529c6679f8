package runtime_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fastRetry is the default policy scaled down to milliseconds.
func fastRetry() policy.Retry {
	return policy.Retry{
		MaxRetries: 2, InitialBackoff: time.Millisecond, Multiplier: 2, MaxBackoff: 4 * time.Millisecond,
		Jitter: 0.25, MaxRetryAfter: 50 * time.Millisecond, Cooldown: time.Minute,
		BudgetTokens: 10, BudgetRefill: 1,
	}
}

func model(alias string, p llm.Provider, fallbacks ...string) *runtime.Model {
	return &runtime.Model{Alias: alias, ProviderName: "fake", Provider: p, ID: alias + "-id", Fallbacks: fallbacks, Retry: fastRetry()}
}

func newRunner(t testing.TB, models []*runtime.Model, tools []llm.Tool, opts ...runtime.Option) *runtime.Runner {
	t.Helper()
	opts = append([]runtime.Option{runtime.WithJitter(func() float64 { return 0.5 })}, opts...)
	r, err := runtime.New(models, models[0].Alias, tools, opts...)
	if err != nil {
		t.Fatalf("runtime.New: %v", err)
	}
	return r
}

// withLimits returns an option with the default limits changed by edit.
func withLimits(edit func(*runtime.Limits)) runtime.Option {
	l := runtime.DefaultLimits()
	edit(&l)
	return runtime.WithLimits(l)
}

func userTurn(text string) *runtime.TurnRequest {
	return &runtime.TurnRequest{TurnID: "t1", Messages: []llm.Message{{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(text)}}}}
}

// recorder is a Sink that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []runtime.Event
}

func (r *recorder) Emit(_ context.Context, ev runtime.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	return nil
}

func run(t testing.TB, ctx context.Context, r *runtime.Runner, req *runtime.TurnRequest) ([]runtime.Event, *runtime.TurnCompleted, *runtime.TurnError) {
	t.Helper()
	rec := &recorder{}
	res, err := r.Run(ctx, req, rec)
	checkSequence(t, rec.events)
	if err != nil {
		te, ok := err.(*runtime.TurnError)
		if !ok {
			t.Fatalf("Run returned %T %v, want *runtime.TurnError", err, err)
		}
		return rec.events, nil, te
	}
	return rec.events, res, nil
}

// checkSequence asserts the invariants every turn keeps: seq from 1
// without gaps, one terminal event, last.
func checkSequence(t testing.TB, evs []runtime.Event) {
	t.Helper()
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
		if ev.Terminal() != (i == len(evs)-1) {
			t.Fatalf("event %d (%s) terminal=%v, of %d events", i, describe(ev), ev.Terminal(), len(evs))
		}
	}
}

// describe renders an event compactly for sequence assertions.
func describe(ev runtime.Event) string {
	switch p := ev.Payload.(type) {
	case *runtime.TurnStarted:
		return "start"
	case *runtime.LLMCallStarted:
		return fmt.Sprintf("call %s#%d", p.Model, p.Attempt)
	case *runtime.TextDelta:
		return "text"
	case *runtime.ThinkingDelta:
		return "thinking"
	case *runtime.ToolCallDelta:
		return "tooldelta"
	case *runtime.MessageCompleted:
		return "commit " + p.Message.Role.String()
	case *runtime.ToolStarted:
		return "tool " + p.Name
	case *runtime.ToolProgress:
		return "progress"
	case *runtime.ToolFinished:
		if p.IsError {
			return "toolerr " + p.Name
		}
		return "tooldone " + p.Name
	case *runtime.LLMCallFinished:
		if e := p.Err; e != nil {
			return "failed " + e.Kind.String()
		}
		return "finished"
	case *runtime.Retry:
		s := fmt.Sprintf("retry %d/%d %s", p.Attempt, p.MaxAttempts, p.Kind)
		if p.DiscardPartial {
			s += " discard"
		}
		return s
	case *runtime.Fallback:
		s := fmt.Sprintf("fallback %s>%s %s", p.From, p.To, p.Kind)
		if p.DiscardPartial {
			s += " discard"
		}
		return s
	case *runtime.Hedge:
		return fmt.Sprintf("hedge %s>%s", p.From, p.To)
	case *runtime.Compaction:
		return "compaction"
	case *runtime.UsageUpdated:
		return "usage"
	case *runtime.TurnError:
		r := "unset"
		if p.Retryable != nil {
			r = fmt.Sprint(*p.Retryable)
		}
		return fmt.Sprintf("error %s retryable=%s", p.Kind, r)
	case *runtime.TurnCompleted:
		return "completed " + p.Reason.String()
	}
	return "?"
}

func describeAll(evs []runtime.Event) string {
	var out []string
	for _, ev := range evs {
		d := describe(ev)
		// Collapse runs of the same delta kind.
		if n := len(out); n > 0 && (d == "text" || d == "tooldelta" || d == "thinking") && out[n-1] == d {
			continue
		}
		out = append(out, d)
	}
	return strings.Join(out, " | ")
}

// providerErr returns a classified provider failure.
func providerErr(k llm.Kind, retryAfter time.Duration) *llm.Error {
	return &llm.Error{Kind: k, Message: "upstream says " + k.String(), RetryAfter: retryAfter}
}

var _ = fake.Text

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
