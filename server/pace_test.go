package server_test

import (
	"context"
	"io"
	"iter"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// stepped is a provider whose calls stream the chunks the test sends, as
// it sends them, until a stop chunk or the call's end.
type stepped struct{ chunks chan llm.Chunk }

func (p stepped) Stream(ctx context.Context, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for {
			select {
			case c := <-p.chunks:
				if !yield(c, nil) || c.Kind == llm.ChunkStop {
					return
				}
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return
			}
		}
	}
}

// TestStorePace: with a store and a pace (store.frame_interval), a
// reply's first delta is stored and sent at once, while what continues it
// waits for the pace (an hour here: until the call ends) and comes as one
// event; without a pace each chunk the model streams after the store
// answered is an event of its own. Either way the client gets what is
// stored: a watch replays the same events.
func TestStorePace(t *testing.T) {
	t.Parallel()
	text := func(s string) llm.Chunk { return llm.Chunk{Kind: llm.ChunkText, Text: s} }
	tests := []struct {
		name string
		pace time.Duration
		// Each step sends its chunks, then waits for the text deltas
		// listed.
		steps [][2][]string
		want  string // every event of the turn (wiretest.Names: runs of deltas as one)
	}{
		{"paced", time.Hour, [][2][]string{
			{{"a"}, {"a"}},
			{{"b", "c", ""}, {"bc"}},
		}, "TurnStarted LlmCallStarted TextDelta LlmCallFinished MessageCompleted TurnCompleted"},
		{"no pace", 0, [][2][]string{
			{{"a"}, {"a"}},
			{{"b"}, {"b"}},
			{{"c", ""}, {"c"}},
		}, "TurnStarted LlmCallStarted TextDelta LlmCallFinished MessageCompleted TurnCompleted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := stepped{chunks: make(chan llm.Chunk)}
			ts := start(t, runner(t, p), server.Options{Store: memStore(t), StorePace: tt.pace})
			ctx, cancel := context.WithTimeout(t.Context(), waitBound)
			defer cancel()
			stream, err := ts.client.RunTurn(ctx, hello())
			if err != nil {
				t.Fatal(err)
			}
			var evs []*turnstilev1.AgentEvent
			next := func() *turnstilev1.AgentEvent {
				t.Helper()
				resp, err := stream.Recv()
				if err != nil {
					t.Fatalf("after %s: %v", wiretest.Names(evs), err)
				}
				evs = append(evs, resp.GetEvent())
				return resp.GetEvent()
			}
			for range 2 { // TurnStarted, LlmCallStarted
				next()
			}
			for i, step := range tt.steps {
				for _, c := range step[0] {
					if c == "" {
						p.chunks <- llm.Chunk{Kind: llm.ChunkStop, Stop: llm.StopEndTurn}
						continue
					}
					p.chunks <- text(c)
				}
				for _, want := range step[1] {
					if got := next().GetTextDelta(); got == nil || got.GetText() != want {
						t.Fatalf("step %d: event %v, want the text delta %q", i, evs[len(evs)-1], want)
					}
				}
			}
			for {
				resp, err := stream.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				evs = append(evs, resp.GetEvent())
			}
			if got := wiretest.Names(evs); got != tt.want || len(evs) != 5+len(tt.steps) {
				t.Errorf("%d events:\n got %s\nwant %s, of which %d text deltas", len(evs), got, tt.want, len(tt.steps))
			}
			got, st := watch(t, ctx, ts.client, &turnstilev1.WatchTurnRequest{TurnId: "turn-1"})
			sameEvents(t, "watch", got, evs)
			sameStatus(t, "watch", st, status.New(codes.OK, ""))
		})
	}
}
