package providertest

import (
	"context"
	"errors"
	"fmt"
	"iter"
	goruntime "runtime"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// item is one value a script provider yields.
type item struct {
	c   llm.Chunk
	err error
}

// script is a provider that yields its items in order, whatever the
// request.
type script []item

func (s script) Stream(context.Context, *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, it := range s {
			if !yield(it.c, it.err) {
				return
			}
		}
	}
}

// recorder is a testing.TB that records failures instead of reporting
// them; Fatalf ends the calling goroutine, as the real one does.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	goruntime.Goexit()
}

// run calls f with a recorder in its own goroutine, so that Fatalf can end
// it, and returns the failures it recorded.
func run(t *testing.T, f func(tb testing.TB)) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failures
}

func TestCollectInvariants(t *testing.T) {
	t.Parallel()
	text := llm.Chunk{Kind: llm.ChunkText, Text: "a"}
	stop := llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn}
	boom := &llm.Error{Kind: llm.KindServerError, Message: "boom"}
	tests := []struct {
		name  string
		items script
		fails bool
	}{
		{name: "text then stop", items: script{{c: text}, {c: stop}}},
		{name: "text then error", items: script{{c: text}, {err: boom}}},
		{name: "chunk after error", items: script{{err: boom}, {c: text}}, fails: true},
		{name: "second error", items: script{{err: boom}, {err: boom}}, fails: true},
		{name: "error with a chunk", items: script{{c: text, err: boom}}, fails: true},
		{name: "chunk after stop", items: script{{c: stop}, {c: text}}, fails: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			failures := run(t, func(tb testing.TB) { _, _ = Collect(tb, t.Context(), tt.items, nil) })
			if got := len(failures) > 0; got != tt.fails {
				t.Errorf("failures = %q, want failing %v", failures, tt.fails)
			}
		})
	}
}

func TestCheckYield(t *testing.T) {
	t.Parallel()
	boom := &llm.Error{Kind: llm.KindServerError, Message: "boom"}
	tests := []struct {
		name  string
		items []item
		fails bool
	}{
		{name: "stop", items: []item{{c: llm.Chunk{Kind: llm.ChunkStop}}}},
		{name: "error", items: []item{{err: boom}}},
		{name: "neither stop nor error", items: []item{{c: llm.Chunk{Kind: llm.ChunkText}}}, fails: true},
		{name: "chunk after error", items: []item{{err: boom}, {c: llm.Chunk{Kind: llm.ChunkStop}}}, fails: true},
		{name: "not a runtime.Error", items: []item{{err: errors.New("plain")}}, fails: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			failures := run(t, func(tb testing.TB) {
				yield, end := CheckYield(tb)
				for _, it := range tt.items {
					yield(it.c, it.err)
				}
				end()
			})
			if got := len(failures) > 0; got != tt.fails {
				t.Errorf("failures = %q, want failing %v", failures, tt.fails)
			}
		})
	}
}
