package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// toolCalls runs a turn's server-side tool calls: the calls of a
// committed reply, in parallel and bounded, after their approval, each
// under its timeout and its tool's breaker, and their results fitted to
// the step's budget. It holds what the calls touch, guarded by mu as they
// run in parallel, and what a resumed turn's previous runner left of them.
type toolCalls struct {
	t *turn
	// resumed holds what the previous runner of a resumed turn left of
	// the tool calls it was running; nil once they are dealt with.
	resumed *Resume
	// restarted holds the calls of a resumed turn's tools that its
	// previous runner had started: a steering message does not skip them.
	restarted map[string]bool

	mu sync.Mutex // guards what parallel tool calls touch below
	// unsafeRunning counts the tools with side effects started since the
	// last commit: replaying the step could run them twice.
	unsafeRunning int
	// breaker counts each tool's consecutive failures in this turn.
	breaker map[string]int
	// answered holds, by call id, the results of the running step's tool
	// calls whose ToolFinished was emitted; started holds when the others
	// whose ToolStarted was emitted began. A cancel answers the rest.
	answered map[string]llm.ToolResult
	started  map[string]time.Time
}

// toolPanic is a panic recovered in a tool call; it ends the turn.
type toolPanic struct {
	tool  string
	value any
	stack []byte
}

func (p *toolPanic) Error() string { return fmt.Sprintf("tool %q panicked: %v", p.tool, p.value) }

// runTools runs the server-side tool calls of a committed assistant
// message in parallel and commits their results. It reports done=false when
// calls remain that the client must run, and ended when a tool that ends
// the turn succeeded.
func (tc *toolCalls) runTools(ctx context.Context, calls []llm.ToolCall) (done, ended bool, err error) {
	client := map[string]bool{}
	for _, s := range tc.t.req.ClientTools {
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
	if len(server) == 0 {
		return pending == 0, false, nil
	}
	known, err := tc.resumedResults(server)
	if err != nil {
		return false, false, err
	}
	results, err := tc.execute(ctx, tc.t.chain.current(), server, known)
	if err != nil {
		return false, false, err
	}
	tc.shareResultBudget(results)
	msg := llm.Message{Role: llm.RoleTool, Parts: make([]llm.Part, len(results))}
	for i := range results {
		msg.Parts[i] = llm.Part{Kind: llm.PartToolResult, ToolResult: &results[i]}
	}
	tc.mu.Lock()
	tc.unsafeRunning = 0
	tc.answered, tc.started = nil, nil
	tc.mu.Unlock()
	tc.t.commit(ctx, msg)
	return pending == 0, tc.endedByTool(results), nil
}

// execute runs calls with bounded parallelism and returns their results in
// call order; a call with a known result (a resumed turn's, stored before)
// is not run. It fails only when the turn must end: it stopped
// (cancelled, or its sink failed) or a tool panicked.
func (tc *toolCalls) execute(ctx context.Context, m *Model, calls []llm.ToolCall, known []*llm.ToolResult) ([]llm.ToolResult, error) {
	limits := tc.t.r.opts.limits
	results := make([]llm.ToolResult, len(calls))
	sem := make(chan struct{}, limits.ToolConcurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var panicked *toolPanic
	defer func() { tc.restarted = nil }()
	decided, err := tc.approve(ctx, m, calls, known)
	if err != nil {
		return nil, err
	}
	// notRun marks the calls a person kept from running: they do not
	// count against their tool's breaker.
	notRun := make([]bool, len(calls))
	for i, c := range calls {
		if i < len(known) && known[i] != nil {
			results[i] = *known[i]
			tc.answer(*known[i])
			continue
		}
		tool, ok := tc.t.r.tools[c.Name]
		d, asked := decided[c.ID]
		switch {
		case tc.t.ctl.steering() && !tc.restarted[c.ID]:
			results[i], notRun[i] = tc.refuse(ctx, c, SkippedToolResult), true
			continue
		case asked && !d.Approved:
			results[i], notRun[i] = tc.refuse(ctx, c, deniedResult(d)), true
			continue
		case !asked && ok && tc.t.r.approval[c.Name] && allowed(m, c.Name) && jsonObject(c.Arguments):
			// Its wait ended without a decision: a steering message came.
			results[i], notRun[i] = tc.refuse(ctx, c, SkippedToolResult), true
			continue
		case !ok || !allowed(m, c.Name):
			results[i] = tc.refuse(ctx, c, fmt.Sprintf("unknown tool %q; available tools: %s", c.Name, strings.Join(tc.toolNames(m), ", ")))
			continue
		case !jsonObject(c.Arguments):
			results[i] = tc.refuse(ctx, c, fmt.Sprintf("the arguments of tool %q are not a valid JSON object; call it again with a JSON object", c.Name))
			continue
		case tc.breakerCount(c.Name) >= limits.ToolFailures:
			results[i] = tc.refuse(ctx, c, fmt.Sprintf("tool %q is disabled for the rest of this turn after %d consecutive failures", c.Name, limits.ToolFailures))
			continue
		}
		if ctx.Err() != nil {
			// Stopped: no tool starts (the select below may pick either).
			tc.awaitTools(ctx, &wg)
			return nil, tc.t.stopped(ctx)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			tc.awaitTools(ctx, &wg)
			return nil, tc.t.stopped(ctx)
		}
		if tc.t.ctl.steering() && !tc.restarted[c.ID] {
			// The user redirected the turn while the call waited for its
			// turn to run.
			<-sem
			results[i], notRun[i] = tc.refuse(ctx, c, SkippedToolResult), true
			continue
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
			results[i] = tc.callTool(ctx, tool, c)
		}()
	}
	if !tc.awaitTools(ctx, &wg) {
		return nil, tc.t.stopped(ctx)
	}
	if panicked != nil {
		tc.t.r.opts.logger.Error("tool panicked", "turn_id", tc.t.info.TurnID, "tool", panicked.tool, "panic", fmt.Sprint(panicked.value), "stack", string(panicked.stack))
		return nil, &llm.Error{Kind: llm.KindInternal, Message: fmt.Sprintf("internal error: tool %q crashed", panicked.tool), Err: panicked}
	}
	if err := tc.t.stopped(ctx); err != nil {
		return nil, err
	}
	for i, res := range results {
		if i < len(known) && known[i] != nil {
			continue // counted by the runner that ran it
		}
		tc.t.counters.ToolCalls++
		if res.IsError {
			tc.t.counters.ToolErrors++
		}
		if !notRun[i] {
			tc.breakerRecord(res.Name, res.IsError)
		}
	}
	return results, nil
}

// jsonObject reports whether args is a JSON object, as tool arguments
// must be.
func jsonObject(args string) bool {
	return json.Valid([]byte(args)) && strings.HasPrefix(strings.TrimSpace(args), "{")
}

// ToolStopGrace bounds how long a stopped turn waits for its running tools
// to return once their context is cancelled. A tool that ignores its
// context is left running, its result dropped, so that the turn still
// ends at once.
const ToolStopGrace = 500 * time.Millisecond

// awaitTools waits until the tool calls wg counts have returned, or, once
// the turn has stopped, ToolStopGrace more; it reports whether they all
// returned.
func (tc *toolCalls) awaitTools(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
	}
	timer := time.NewTimer(ToolStopGrace)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		tc.t.r.opts.logger.Warn("a tool did not return after the turn stopped; its result is dropped",
			"turn_id", tc.t.info.TurnID, "grace", ToolStopGrace)
		return false
	}
}

// shareResultBudget cuts the results of one step so that together they fit
// the turn's MaxToolResultBytes, as the message that commits them must.
func (tc *toolCalls) shareResultBudget(results []llm.ToolResult) {
	tc.fitResultMedia(results)
	contents := make([]string, len(results))
	for i, r := range results {
		contents[i] = r.Content
	}
	max := tc.t.r.opts.limits.MaxToolResultBytes - mediaBytes(results)
	for _, i := range shareBudget(contents, max) {
		tc.t.r.opts.logger.Warn("tool result truncated to share the step's budget", "turn_id", tc.t.info.TurnID, "tool", results[i].Name,
			"call_id", results[i].CallID, "bytes", len(results[i].Content), "max_tool_result_bytes", max, "results", len(results))
		results[i].Content = contents[i]
	}
}

// refuse returns an error result for a call that is not run, and emits its
// ToolFinished event.
func (tc *toolCalls) refuse(ctx context.Context, c llm.ToolCall, msg string) llm.ToolResult {
	res := llm.ToolResult{CallID: c.ID, Name: c.Name, Content: msg, IsError: true}
	if tc.t.out.emit(ctx, &ToolFinished{CallID: c.ID, Name: c.Name, Content: msg, IsError: true}) != 0 {
		tc.answer(res)
	}
	return res
}

// answer records the result of one of the running step's tool calls,
// which a cancel keeps.
func (tc *toolCalls) answer(res llm.ToolResult) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.answered == nil {
		tc.answered = map[string]llm.ToolResult{}
	}
	tc.answered[res.CallID] = res
	delete(tc.started, res.CallID)
}

// callTool runs one tool call with its timeout, emitting its events.
func (tc *toolCalls) callTool(ctx context.Context, tool llm.Tool, c llm.ToolCall) llm.ToolResult {
	spec := tool.Spec()
	if !spec.Idempotent && !spec.ReadOnly {
		tc.mu.Lock()
		tc.unsafeRunning++
		tc.mu.Unlock()
	}
	info := ToolInfo{TurnID: tc.t.info.TurnID, CallID: c.ID, Name: c.Name, Arguments: c.Arguments, ReadOnly: spec.ReadOnly, Idempotent: spec.Idempotent}
	if tc.t.out.emit(ctx, &ToolStarted{CallID: c.ID, Name: c.Name, Arguments: c.Arguments}) != 0 {
		tc.mu.Lock()
		if tc.started == nil {
			tc.started = map[string]time.Time{}
		}
		tc.started[c.ID] = time.Now()
		tc.mu.Unlock()
	}
	timeout := tc.t.r.opts.limits.ToolTimeout
	if tt, ok := tool.(interface{ Timeout() time.Duration }); ok && tt.Timeout() > 0 {
		timeout = tt.Timeout()
	}
	octx := tc.t.obs.ToolStart(ctx, info)
	tctx, cancel := context.WithTimeout(octx, timeout)
	defer cancel()
	start := time.Now()
	var live sync.Mutex // progress may arrive from any goroutine until Call returns
	finished := false
	out, err := tool.Call(tctx, c, func(p llm.ToolProgress) {
		live.Lock()
		defer live.Unlock()
		if !finished {
			tc.t.out.emit(ctx, &ToolProgress{CallID: c.ID, Name: c.Name, ToolProgress: p})
		}
	})
	live.Lock()
	finished = true
	live.Unlock()
	dur := time.Since(start)
	res := llm.ToolResult{CallID: c.ID, Name: c.Name, Content: out.Content, IsError: out.IsError, Media: out.Media}
	switch {
	case ctx.Err() != nil:
	case err != nil && tctx.Err() != nil:
		res.Content, res.IsError = fmt.Sprintf("tool %q timed out after %s", c.Name, timeout), true
	case err != nil:
		res.Content, res.IsError = fmt.Sprintf("tool %q failed: %v", c.Name, err), true
	}
	if err != nil {
		res.Media = nil
	}
	if content, cut := truncated(res.Content, tc.t.r.opts.limits.MaxToolResultBytes); cut {
		tc.t.r.opts.logger.Warn("tool result truncated", "turn_id", tc.t.info.TurnID, "tool", c.Name, "call_id", c.ID,
			"bytes", len(res.Content), "max_tool_result_bytes", tc.t.r.opts.limits.MaxToolResultBytes)
		res.Content = content
	}
	tc.t.obs.ToolEnd(octx, info, ToolEnd{Content: res.Content, IsError: res.IsError, Duration: dur})
	if ctx.Err() != nil {
		return res // the turn is ending; nothing more is emitted
	}
	if tc.t.out.emit(ctx, &ToolFinished{CallID: c.ID, Name: c.Name, Content: res.Content, IsError: res.IsError, Duration: dur}) != 0 {
		tc.answer(res)
	}
	return res
}

// cancelled returns the results of calls, the calls without results of
// the reply a cancelled turn closes (see [turn.closeCancelled]): the
// result a call had finished with, else [CancelledToolResult] (an error),
// with its ToolFinished for a call that was running; fitted together to
// the step's budget.
func (tc *toolCalls) cancelled(ctx context.Context, calls []llm.ToolCall) []llm.ToolResult {
	tc.mu.Lock()
	answered, started := tc.answered, tc.started
	tc.answered, tc.started = nil, nil
	tc.mu.Unlock()
	results := make([]llm.ToolResult, len(calls))
	for i, c := range calls {
		if r, ok := answered[c.ID]; ok {
			results[i] = r
			continue
		}
		results[i] = llm.ToolResult{CallID: c.ID, Name: c.Name, Content: CancelledToolResult, IsError: true}
		if at, ok := started[c.ID]; ok {
			tc.t.out.emit(ctx, &ToolFinished{CallID: c.ID, Name: c.Name, Content: CancelledToolResult, IsError: true, Duration: time.Since(at)})
		}
	}
	tc.shareResultBudget(results)
	return results
}

// unsafe reports whether a tool with side effects was started since the
// last commit: replaying the step could run it twice.
func (tc *toolCalls) unsafe() bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.unsafeRunning > 0
}

// toolSpecs lists the tools offered to model m: its allowed server tools,
// then the client's.
func (tc *toolCalls) toolSpecs(m *Model) []llm.ToolSpec {
	if m.Tools == nil && len(tc.t.req.ClientTools) == 0 {
		return tc.t.r.toolSpecs
	}
	var specs []llm.ToolSpec
	for _, s := range tc.t.r.toolSpecs {
		if allowed(m, s.Name) {
			specs = append(specs, s)
		}
	}
	return append(specs, tc.t.req.ClientTools...)
}

// allowed reports whether model m may call server-side tool name.
func allowed(m *Model, name string) bool {
	return m.Tools == nil || slices.Contains(m.Tools, name)
}

func (tc *toolCalls) toolNames(m *Model) []string {
	var names []string
	for name := range tc.t.r.tools {
		if allowed(m, name) {
			names = append(names, name)
		}
	}
	for _, s := range tc.t.req.ClientTools {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return []string{"(none)"}
	}
	return names
}

// breakerCount returns the consecutive failures of tool name in this turn.
func (tc *toolCalls) breakerCount(name string) int {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.breaker[name]
}

func (tc *toolCalls) breakerRecord(name string, failed bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.breaker == nil {
		tc.breaker = map[string]int{}
	}
	if failed {
		tc.breaker[name]++
	} else {
		tc.breaker[name] = 0
	}
}
