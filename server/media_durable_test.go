package server_test

import (
	"context"
	"iter"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
	"github.com/turnstile-dev/turnstile/runtime"
)

// recordingMedia is a byCall provider that takes every kind of input and
// records each request.
type recordingMedia struct {
	*byCall
	mu   sync.Mutex
	reqs []*llm.Request
}

func (p *recordingMedia) Inputs(string) []llm.Modality { return llm.Modalities }
func (p *recordingMedia) FetchesURI(llm.Modality) bool { return true }

func (p *recordingMedia) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	p.mu.Unlock()
	return p.byCall.Stream(ctx, req)
}

func (p *recordingMedia) last() *llm.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reqs[len(p.reqs)-1]
}

// TestTakeoverKeepsMedia: a durable turn whose request holds an image and
// whose tool returned one is taken over by another replica, which rebuilds
// both from the log: the model call it makes carries the user's image and
// the tool result's media, bytes and all.
func TestTakeoverKeepsMedia(t *testing.T) {
	t.Parallel()
	shot := llm.Media{MIMEType: "image/png", Data: []byte("\x89PNG tool"), Name: "s.png"}
	tool := fake.NewTool("shot", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "the screen", Media: []llm.Media{shot}}, nil
	})
	tool.ToolSpec.ReadOnly = true
	p := &recordingMedia{byCall: &byCall{script: func(ctx context.Context, n int) iter.Seq2[llm.Chunk, error] {
		switch n {
		case 1:
			return chunks(ctx, false, fake.Call("c1", "shot", `{}`)...)
		case 2:
			return chunks(ctx, true, textChunk("It shows")) // its replica dies here
		}
		return chunks(ctx, false, fake.Text("It shows a cat.")...)
	}}}
	retry := policy.DefaultRetry()
	retry.InitialBackoff, retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	newRunner := func() *runtime.Runner {
		r, err := runtime.New([]*runtime.Model{{Alias: "sim", ProviderName: "fake", Provider: p, ID: "fake-1", Retry: retry}}, "sim", []llm.Tool{tool})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rs := startReplicas(t, 2, func(int) *runtime.Runner { return newRunner() }, detachAfter(5*time.Second))
	rp := &replicaPair{a: rs[0], b: rs[1], storeA: rs[0].store, provider: p.byCall}

	req := hello()
	req.Messages[0].Parts = append(req.Messages[0].Parts, image("image/jpeg", []byte("\xff\xd8\xff user")))
	ctx, cut := context.WithCancel(t.Context())
	stream, err := rp.a.client.RunTurn(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var head []*turnstilev1.AgentEvent
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		head = append(head, r.GetEvent())
		if r.GetEvent().GetTextDelta() != nil {
			break
		}
	}
	rp.kill(cut)
	all, st := resumeOnB(t, rp, head)
	if st.Code() != codes.OK || p.calls() != 3 {
		t.Fatalf("status %v after %d model calls: %s", st, p.calls(), wiretest.Names(all))
	}
	msgs := p.last().Messages
	if len(msgs) != 3 {
		t.Fatalf("the resumed call got %d messages", len(msgs))
	}
	if m := msgs[0].Parts[1].Media; m == nil || m.MIMEType != "image/jpeg" || string(m.Data) != "\xff\xd8\xff user" {
		t.Errorf("user media after the takeover = %+v", m)
	}
	if got := msgs[2].Parts[0].ToolResult.Media; len(got) != 1 || got[0].MIMEType != shot.MIMEType || string(got[0].Data) != string(shot.Data) || got[0].Name != shot.Name {
		t.Errorf("tool result media after the takeover = %+v", got)
	}
}
