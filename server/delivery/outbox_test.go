package delivery

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// blockingStream is a stream whose Send blocks from the n-th message on,
// until released, as gRPC's does while the client's window is full.
type blockingStream struct {
	grpc.ServerStreamingServer[turnstilev1.RunTurnResponse]
	n       int
	sent    []*turnstilev1.RunTurnResponse
	release chan struct{}
}

func (s *blockingStream) Send(m *turnstilev1.RunTurnResponse) error {
	if len(s.sent) >= s.n {
		<-s.release
		return errors.New("stream done")
	}
	s.sent = append(s.sent, m)
	return nil
}

// TestOutboxFinishStalls: when the turn's last event is handed over but
// never sent within the send timeout, finish reports the stall (the
// outcome was not delivered) and cancels the turn, without waiting for the
// stuck Send.
func TestOutboxFinishStalls(t *testing.T) {
	stream := &blockingStream{n: 1, release: make(chan struct{})}
	defer close(stream.release)
	var cause error
	cancel := func(err error) { cause = err }
	o := NewOutbox(stream.Send, cancel, Config{SendTimeout: 100 * time.Millisecond, Start: func(f func()) { go f() }}, 2<<20, (*nopCharger)(nil), 1)
	ev := func(seq uint64, p runtime.Payload) runtime.Event {
		return runtime.Event{Seq: seq, Time: time.Now(), TurnID: "t", Payload: p}
	}
	if err := o.Emit(context.Background(), ev(1, &runtime.TurnStarted{Model: "m"})); err != nil {
		t.Fatal(err)
	}
	// Handed over at once: the previous one was sent.
	if err := o.Emit(context.Background(), ev(2, &runtime.TurnCompleted{Reason: runtime.EndTurn})); err != nil {
		t.Fatal(err)
	}
	if !o.Busy() {
		t.Error("the outbox is not busy with a Send under way")
	}
	start := time.Now()
	err := o.Finish(nil)
	var le *llm.Error
	if !errors.As(err, &le) || le.Kind != llm.KindDeadlineExceeded || !errors.Is(cause, err) {
		t.Fatalf("finish = %v, cancel cause %v", err, cause)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("finish took %s", d)
	}
	if len(stream.sent) != 1 {
		t.Errorf("%d events sent, want 1", len(stream.sent))
	}
}

// TestStreamHoldsNoGoroutineBetweenSends: a stream waiting for its next
// event (a slow turn, held open for minutes) holds no goroutine for its
// sends: each Send runs on a goroutine start gives it, which is the
// stream's only until the Send returns; the messages are sent one at a
// time, in order.
func TestStreamHoldsNoGoroutineBetweenSends(t *testing.T) {
	var sent []int
	var ended []chan struct{}
	p := New(func(m int) error { sent = append(sent, m); return nil }, time.Second, func(f func()) {
		done := make(chan struct{})
		ended = append(ended, done)
		go func() { defer close(done); f() }()
	}, nil)
	for m := range 3 {
		if err := p.Put(m); err != nil {
			t.Fatal(err)
		}
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		// Sent and acknowledged: the goroutine of its Send ends.
		select {
		case <-ended[len(ended)-1]:
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d: the goroutine that sent it still runs", m)
		}
	}
	p.Close()
	if len(ended) != 3 || !slices.Equal(sent, []int{0, 1, 2}) {
		t.Errorf("%d Sends started, sent %v; want 3 and [0 1 2]", len(ended), sent)
	}
}

// nopCharger charges nothing.
type nopCharger struct{}

func (*nopCharger) Event(runtime.Event) {}
