package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// toolPanic is a panic recovered in a tool call; it ends the turn.
type toolPanic struct {
	tool  string
	value any
	stack []byte
}

func (p *toolPanic) Error() string { return fmt.Sprintf("tool %q panicked: %v", p.tool, p.value) }

// runTools runs the server-side tool calls of a committed assistant
// message in parallel and commits their results. It reports done=false when
// calls remain that the client must run.
func (t *turn) runTools(ctx context.Context, calls []llm.ToolCall) (done bool, err error) {
	m := t.chain[t.pos]
	client := map[string]bool{}
	for _, s := range t.req.ClientTools {
		client[s.Name] = true
	}
	var server []llm.ToolCall
	pending := 0
	for _, c := range calls {
		if client[c.Name] {
			pending++
			continue
		}
		server = append(server, c)
	}
	if len(server) > 0 {
		results, err := t.execute(ctx, m, server)
		if err != nil {
			return false, err
		}
		msg := llm.Message{Role: llm.RoleTool}
		for _, r := range results {
			msg.Parts = append(msg.Parts, llm.Part{Kind: llm.PartToolResult, ToolResult: &r})
		}
		t.unsafeRunning = 0
		if err := t.commit(ctx, msg); err != nil {
			return false, t.sinkFailure(ctx)
		}
	}
	return pending == 0, nil
}

// execute runs calls with bounded parallelism and returns their results in
// call order. It fails only when the turn must end: ctx is done, the sink
// failed, or a tool panicked.
func (t *turn) execute(ctx context.Context, m *Model, calls []llm.ToolCall) ([]llm.ToolResult, error) {
	r := t.r
	results := make([]llm.ToolResult, len(calls))
	sem := make(chan struct{}, r.opts.limits.ToolConcurrency)
	var wg sync.WaitGroup
	var panicked error
	var mu sync.Mutex
	for i, c := range calls {
		tool, ok := r.tools[c.Name]
		if ok && !t.allowed(m, c.Name) {
			ok = false
		}
		if !ok {
			results[i] = t.refuse(c, fmt.Sprintf("unknown tool %q; available tools: %s", c.Name, strings.Join(t.toolNames(m), ", ")))
			continue
		}
		if !json.Valid([]byte(c.Arguments)) || !strings.HasPrefix(strings.TrimSpace(c.Arguments), "{") {
			results[i] = t.refuse(c, fmt.Sprintf("the arguments of tool %q are not a valid JSON object; call it again with a JSON object", c.Name))
			continue
		}
		if t.breakerCount(c.Name) >= r.opts.limits.ToolFailures {
			results[i] = t.refuse(c, fmt.Sprintf("tool %q is disabled for the rest of this turn after %d consecutive failures", c.Name, r.opts.limits.ToolFailures))
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return nil, t.ctxErr(ctx)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer func() {
				if p := recover(); p != nil {
					mu.Lock()
					panicked = &toolPanic{tool: c.Name, value: p, stack: debug.Stack()}
					mu.Unlock()
				}
			}()
			results[i] = t.callTool(ctx, tool, c)
		}()
	}
	wg.Wait()
	if panicked != nil {
		var tp *toolPanic
		errors.As(panicked, &tp)
		r.opts.logger.Error("tool panicked", "turn_id", t.id, "tool", tp.tool, "panic", tp.value, "stack", string(tp.stack))
		return nil, &llm.Error{Kind: llm.KindInternal, Message: fmt.Sprintf("internal error: tool %q crashed", tp.tool), Err: panicked}
	}
	if err := t.ctxErr(ctx); err != nil {
		return nil, err
	}
	if t.sinkErr != nil {
		return nil, t.sinkFailure(ctx)
	}
	for _, res := range results {
		t.counters.ToolCalls++
		if res.IsError {
			t.counters.ToolErrors++
		}
		t.breakerRecord(res.Name, res.IsError)
	}
	return results, nil
}

// refuse returns an error result for a call that is not run, and emits its
// ToolFinished event.
func (t *turn) refuse(c llm.ToolCall, msg string) llm.ToolResult {
	res := llm.ToolResult{CallID: c.ID, Name: c.Name, Content: msg, IsError: true}
	_ = t.emit(context.Background(), Event{ToolFinished: &ToolFinished{CallID: c.ID, Name: c.Name, Content: msg, IsError: true}})
	return res
}

// callTool runs one tool call with its timeout, emitting its events.
func (t *turn) callTool(ctx context.Context, tool llm.Tool, c llm.ToolCall) llm.ToolResult {
	spec := tool.Spec()
	if !spec.Idempotent && !spec.ReadOnly {
		t.mu.Lock()
		t.unsafeRunning++
		t.mu.Unlock()
	}
	if err := t.emit(ctx, Event{ToolStarted: &ToolStarted{CallID: c.ID, Name: c.Name, Arguments: c.Arguments}}); err != nil {
		return llm.ToolResult{CallID: c.ID, Name: c.Name, IsError: true}
	}
	timeout := t.r.opts.limits.ToolTimeout
	if tt, ok := tool.(interface{ Timeout() time.Duration }); ok && tt.Timeout() > 0 {
		timeout = tt.Timeout()
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	var live sync.Mutex // progress may arrive from any goroutine until Call returns
	finished := false
	out, err := tool.Call(tctx, c, func(p llm.ToolProgress) {
		live.Lock()
		defer live.Unlock()
		if !finished {
			_ = t.emit(ctx, Event{ToolProgress: &ToolProgressEvent{CallID: c.ID, Name: c.Name, ToolProgress: p}})
		}
	})
	live.Lock()
	finished = true
	live.Unlock()
	dur := time.Since(start)
	res := llm.ToolResult{CallID: c.ID, Name: c.Name, Content: out.Content, IsError: out.IsError}
	switch {
	case ctx.Err() != nil:
		return res // the turn is ending; nothing more is emitted
	case err != nil && tctx.Err() != nil:
		res.Content, res.IsError = fmt.Sprintf("tool %q timed out after %s", c.Name, timeout), true
	case err != nil:
		res.Content, res.IsError = fmt.Sprintf("tool %q failed: %v", c.Name, err), true
	}
	_ = t.emit(ctx, Event{ToolFinished: &ToolFinished{CallID: c.ID, Name: c.Name, Content: res.Content, IsError: res.IsError, Duration: dur}})
	return res
}

func (t *turn) toolNames(m *Model) []string {
	var names []string
	for name := range t.r.tools {
		if t.allowed(m, name) {
			names = append(names, name)
		}
	}
	for _, s := range t.req.ClientTools {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return []string{"(none)"}
	}
	return names
}

// breakerCount returns the consecutive failures of tool name in this turn.
func (t *turn) breakerCount(name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.breaker[name]
}

func (t *turn) breakerRecord(name string, failed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.breaker == nil {
		t.breaker = map[string]int{}
	}
	if failed {
		t.breaker[name]++
	} else {
		t.breaker[name] = 0
	}
}
