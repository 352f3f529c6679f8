package client_test

import (
	"context"
	"iter"
	"slices"
	"sync"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// steerAnswer is how the server's answer to a SteerTurn of attempt 1
// starts on the wire: a gRPC message of 4 bytes, attempt 1, then seq. No
// event holds it (events are longer), so a cut proxy loses exactly that
// answer.
const steerAnswer = "\x00\x00\x00\x00\x04\x08\x01\x10"

// TestSteerAnswerLost steers a durable turn through a proxy that cuts the
// connection instead of forwarding the server's answer: the message is
// stored, the client gets UNAVAILABLE and sends it again with the same
// request id, and the turn takes it once. The event stream, cut too,
// re-attaches.
func TestSteerAnswerLost(t *testing.T) {
	tool := &stepTool{started: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	var second *llm.Request
	p := &scripted{fn: func(_ context.Context, call int, req *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call == 1 {
			return callTool("call_1", "step", `{}`)
		}
		mu.Lock()
		second = req
		mu.Unlock()
		return reply("Staging it is.")
	}}
	px := newCutProxy(t, serveDurable(t, newReplica(t, p, tool), sharedStores(t, 1)[0]), steerAnswer, false)
	c := newClient(t, px.addr())
	turn := c.RunTurn(t.Context(), userRequest("deploy"))
	evs := steerWhileToolRuns(t, turn, tool)
	px.mu.Lock()
	cut := px.cut
	px.mu.Unlock()
	if !cut {
		t.Fatal("the proxy never cut the answer: the test proves nothing")
	}
	var ids []string
	for _, ev := range evs {
		if s := ev.Agent.GetSteered(); s != nil {
			ids = append(ids, s.GetRequestId())
		}
	}
	if len(ids) != 1 || len(ids[0]) != 32 {
		t.Errorf("steered events with request ids %q, want one with a random id", ids)
	}
	mu.Lock()
	req := second
	mu.Unlock()
	n := 0
	for _, m := range req.Messages {
		if m.Text() == "use staging instead" {
			n++
		}
	}
	if n != 1 || req.Messages[len(req.Messages)-1].Text() != "use staging instead" {
		t.Errorf("the second model request holds the message %d times: %+v", n, req.Messages)
	}
	if res := turn.Result(); res.Counters.GetSteered() != 1 || len(res.Messages) != 4 {
		t.Errorf("result: counters %v, %d messages", res.Counters, len(res.Messages))
	}
	if got := withoutDeltas(kindsOf(evs)); slices.Index(got, "steered") < 0 {
		t.Errorf("events %v", got)
	}
}
