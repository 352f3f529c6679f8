package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

func TestControlsOutsideTheTurn(t *testing.T) {
	c := runtime.NewControls()
	user := llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("hi")}}
	if _, err := c.Steer(user); !errors.Is(err, runtime.ErrTurnNotStarted) {
		t.Errorf("Steer before the turn: %v, want ErrTurnNotStarted", err)
	}
	if _, _, err := c.Decide("c1", runtime.Decision{}); !errors.Is(err, runtime.ErrTurnNotStarted) {
		t.Errorf("Decide before the turn: %v, want ErrTurnNotStarted", err)
	}
	r := newRunner(t, []*runtime.Model{model("a", fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")}))}, nil)
	req := userTurn("hi")
	req.Controls = c
	if _, res, te := run(t, t.Context(), r, req); te != nil || res.Reason != runtime.EndTurn {
		t.Fatalf("turn: %v %v", res, te)
	}
	if _, err := c.Steer(user); !errors.Is(err, runtime.ErrTurnEnded) {
		t.Errorf("Steer after the turn: %v, want ErrTurnEnded", err)
	}
	if _, _, err := c.Decide("c1", runtime.Decision{}); !errors.Is(err, runtime.ErrTurnEnded) {
		t.Errorf("Decide after the turn: %v, want ErrTurnEnded", err)
	}
}

func TestToolRulesNameServerTools(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("ok")})
	tool := fake.NewTool("deploy", nil)
	_, err := runtime.New([]*runtime.Model{model("a", p)}, "a", []llm.Tool{tool},
		runtime.WithToolRules(runtime.ToolRules{RequireApproval: []string{"deploy", "nope"}, EndsTurn: []string{"gone"}}))
	want := `runtime: tool rules: require_approval: "nope" is no server-side tool` + "\n" + `tool rules: ends_turn: "gone" is no server-side tool`
	if err == nil || err.Error() != want {
		t.Errorf("New: %v\nwant %s", err, want)
	}
}

// TestResumedSteering resumes a turn whose log holds a committed steering
// message as its last: the next model call answers it (it is no cancel),
// and a steered message not yet committed is committed before that call.
func TestResumedSteering(t *testing.T) {
	p := fake.NewProvider(fake.Reply{Chunks: fake.Text("answer")})
	r := newRunner(t, []*runtime.Model{model("a", p)}, nil)
	steer := func(s string) llm.Message { return llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(s)}} }
	req := userTurn("hi")
	req.Resume = &runtime.Resume{
		NextSeq: 9,
		Committed: []llm.Message{
			{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("first")}},
			steer("stop that"),
		},
		Steering: []llm.Message{steer("and this")},
	}
	res, err := r.Run(context.Background(), req, &recorder{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Messages) != 4 || res.Messages[2].Text() != "and this" || res.Messages[3].Text() != "answer" || res.Counters.Steered != 1 {
		t.Errorf("messages %v counters %+v", res.Messages, res.Counters)
	}
	if n := len(p.Requests()[0].Messages); n != 4 {
		t.Errorf("the model saw %d messages, want 4", n)
	}
}

// TestSteeringAtTheCallLimit steers a turn that has no model call left:
// the message is committed before the turn completes with
// MAX_MODEL_CALLS, so the client's conversation holds it.
func TestSteeringAtTheCallLimit(t *testing.T) {
	release := make(chan struct{})
	tool := fake.NewTool("wait", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		<-release
		return llm.ToolOutput{Content: "waited"}, nil
	})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "wait", `{}`)})
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{tool}, withLimits(func(l *runtime.Limits) { l.MaxModelCalls = 1 }))
	req := userTurn("hi")
	req.Controls = runtime.NewControls()
	sink := runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
		if _, ok := ev.Payload.(*runtime.ToolStarted); ok {
			go func() {
				if _, err := req.Controls.Steer(llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart("later")}}); err != nil {
					t.Error(err)
				}
				close(release)
			}()
		}
		return nil
	})
	res, err := r.Run(t.Context(), req, sink)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != runtime.EndMaxModelCalls || len(res.Messages) != 3 || res.Messages[2].Text() != "later" || res.Counters.Steered != 1 {
		t.Errorf("result %v %v counters %+v", res.Reason, res.Messages, res.Counters)
	}
}

// previewTool is a tool that says what a call would do.
type previewTool struct{ *fake.Tool }

func (previewTool) Preview(args string) string { return "would deploy " + args }

// TestApprovalRequestCarriesPreview asks for approval of a call of a tool
// that can preview it, approves it, and sees it run.
func TestApprovalRequestCarriesPreview(t *testing.T) {
	tool := previewTool{fake.NewTool("deploy", func(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
		return llm.ToolOutput{Content: "done"}, nil
	})}
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "deploy", `{"env":"prod"}`)}, fake.Reply{Chunks: fake.Text("ok")})
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{tool}, runtime.WithToolRules(runtime.ToolRules{RequireApproval: []string{"deploy"}}))
	req := userTurn("hi")
	req.Controls = runtime.NewControls()
	var asked *runtime.ToolApprovalRequested
	sink := runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
		if a, ok := ev.Payload.(*runtime.ToolApprovalRequested); ok {
			asked = a
			go func() {
				d, applied, err := req.Controls.Decide("c1", runtime.Decision{Approved: true})
				if err != nil || !applied || !d.Approved || d.Seq != ev.Seq+1 {
					t.Errorf("Decide = %+v, %v, %v", d, applied, err)
				}
			}()
		}
		return nil
	})
	res, err := r.Run(t.Context(), req, sink)
	if err != nil {
		t.Fatal(err)
	}
	if asked == nil || asked.Preview != `would deploy {"env":"prod"}` || asked.Deadline.IsZero() {
		t.Errorf("request = %+v", asked)
	}
	if len(tool.Calls()) != 1 || res.Counters.ApprovalsRequested != 1 || res.Counters.ApprovalsDenied != 0 {
		t.Errorf("calls %d, counters %+v", len(tool.Calls()), res.Counters)
	}
}

// TestSteerOnce steers a turn whose tool runs with request ids: an id
// taken already answers its first seq and queues nothing (also when the
// queue is full, and after the turn ended); a resumed turn knows the ids
// its log holds, the last Limits.MaxSteerMessages of them.
func TestSteerOnce(t *testing.T) {
	release := make(chan struct{})
	tool := fake.NewTool("wait", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
		<-release
		return llm.ToolOutput{Content: "waited"}, nil
	})
	p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "wait", `{}`)}, fake.Reply{Chunks: fake.Text("ok")})
	r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{tool}, withLimits(func(l *runtime.Limits) { l.MaxSteerMessages = 2 }))
	msg := func(s string) llm.Message { return llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(s)}} }
	type want struct {
		id   string
		seq  uint64 // 0: a new seq
		dup  bool
		fail error
	}
	req := userTurn("hi")
	c := runtime.NewControls()
	req.Controls = c
	seqs := map[string]uint64{}
	steerAll := func(steps []want) {
		for _, w := range steps {
			seq, dup, err := c.SteerOnce(w.id, msg("text of "+w.id))
			switch {
			case w.fail != nil:
				if !errors.Is(err, w.fail) {
					t.Errorf("SteerOnce(%q) = %v, want %v", w.id, err, w.fail)
				}
			case err != nil || dup != w.dup || w.dup && seq != seqs[w.id]:
				t.Errorf("SteerOnce(%q) = %d, %v, %v; want duplicate %v of %d", w.id, seq, dup, err, w.dup, seqs[w.id])
			case !w.dup:
				seqs[w.id] = seq
			}
		}
	}
	var steered []string
	sink := runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
		switch e := ev.Payload.(type) {
		case *runtime.Steered:
			steered = append(steered, e.RequestID)
		case *runtime.ToolStarted:
			go func() {
				steerAll([]want{
					{id: "r1"}, {id: "r1", dup: true}, {id: "r2"},
					{id: "r1", dup: true}, // the queue is full: still the first
					{id: "r3", fail: runtime.ErrSteerQueueFull},
				})
				close(release)
			}()
		}
		return nil
	})
	res, err := r.Run(t.Context(), req, sink)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(steered, ",") != "r1,r2" || len(res.Messages) != 5 || res.Messages[2].Text() != "text of r1" || res.Messages[3].Text() != "text of r2" || res.Counters.Steered != 2 {
		t.Errorf("steered %q, result %v counters %+v", steered, res.Messages, res.Counters)
	}
	steerAll([]want{{id: "r2", dup: true}, {id: "r9", fail: runtime.ErrTurnEnded}, {id: "", fail: runtime.ErrTurnEnded}})

	// Resumed with three ids in its log and room for two: the oldest is
	// forgotten.
	p = fake.NewProvider(fake.Reply{Chunks: fake.Text("answer")})
	r = newRunner(t, []*runtime.Model{model("a", p)}, nil, withLimits(func(l *runtime.Limits) { l.MaxSteerMessages = 2 }))
	req = userTurn("hi")
	c = runtime.NewControls()
	req.Controls = c
	req.Resume = &runtime.Resume{
		NextSeq:   9,
		Committed: []llm.Message{{Role: llm.RoleAssistant, Parts: []llm.Part{llm.TextPart("first")}}, msg("a"), msg("b"), msg("c")},
		SteerIDs:  []runtime.SteerID{{ID: "a", Seq: 3}, {ID: "b", Seq: 4}, {ID: "c", Seq: 5}},
	}
	if _, err := r.Run(t.Context(), req, &recorder{}); err != nil {
		t.Fatal(err)
	}
	seqs = map[string]uint64{"b": 4, "c": 5}
	steerAll([]want{{id: "b", dup: true}, {id: "c", dup: true}, {id: "a", fail: runtime.ErrTurnEnded}})
}

// TestSteerBudget: the steering messages a turn takes hold at most
// Limits.MaxSteerBytes of text together, over the turn's life (a resumed
// turn counts what its log holds): one more is refused with
// ErrSteerBudget, and the model is sent no more steering text than that.
func TestSteerBudget(t *testing.T) {
	type steer struct {
		text    string
		refused bool
	}
	tests := []struct {
		name    string
		max     int
		resumed int // the steering text a resumed turn's log holds
		steers  []steer
	}{
		{name: "up to the bound", max: 10, steers: []steer{{text: "12345"}, {text: "123456", refused: true}, {text: "12345"}, {text: "x", refused: true}}},
		{name: "none taken", max: 0, steers: []steer{{text: "x", refused: true}}},
		{name: "resumed", max: 10, resumed: 8, steers: []steer{{text: "123", refused: true}, {text: "12"}, {text: "1", refused: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			tool := fake.NewTool("wait", func(ctx context.Context, _ llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
				<-release
				return llm.ToolOutput{Content: "waited"}, nil
			})
			p := fake.NewProvider(fake.Reply{Chunks: fake.Call("c1", "wait", `{}`)}, fake.Reply{Chunks: fake.Text("ok")})
			r := newRunner(t, []*runtime.Model{model("a", p)}, []llm.Tool{tool}, withLimits(func(l *runtime.Limits) { l.MaxSteerBytes = tt.max }))
			req := userTurn("hi")
			req.Controls = runtime.NewControls()
			if tt.resumed > 0 {
				req.Resume = &runtime.Resume{NextSeq: 2, SteerBytes: tt.resumed}
			}
			var taken []string
			sink := runtime.SinkFunc(func(_ context.Context, ev runtime.Event) error {
				if _, ok := ev.Payload.(*runtime.ToolStarted); ok {
					go func() {
						defer close(release)
						for _, s := range tt.steers {
							_, err := req.Controls.Steer(llm.Message{Role: llm.RoleUser, Parts: []llm.Part{llm.TextPart(s.text)}})
							switch {
							case s.refused && !errors.Is(err, runtime.ErrSteerBudget):
								t.Errorf("Steer(%q) = %v, want ErrSteerBudget", s.text, err)
							case !s.refused && err != nil:
								t.Errorf("Steer(%q) = %v", s.text, err)
							case !s.refused:
								taken = append(taken, s.text)
							}
						}
					}()
				}
				return nil
			})
			if _, err := r.Run(t.Context(), req, sink); err != nil {
				t.Fatal(err)
			}
			// The last call carries the steering messages taken, and no
			// other.
			var sent []string
			reqs := p.Requests()
			for _, m := range reqs[len(reqs)-1].Messages {
				if m.Role == llm.RoleUser && m.Text() != "hi" {
					sent = append(sent, m.Text())
				}
			}
			if strings.Join(sent, ",") != strings.Join(taken, ",") || len(strings.Join(sent, ""))+tt.resumed > tt.max {
				t.Errorf("the model was sent steering %q, taken %q (bound %d, %d before)", sent, taken, tt.max, tt.resumed)
			}
		})
	}
}
