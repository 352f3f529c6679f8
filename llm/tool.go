package llm

import "context"

// Tool is a server-side tool the model may call. Implementations must be
// safe for concurrent use: calls of one assistant message run in parallel.
type Tool interface {
	// Spec describes the tool to the model.
	Spec() ToolSpec
	// Call runs the tool with call.Arguments (a JSON object). It reports
	// progress through progress, which may be nil-safe called from any
	// goroutine until Call returns. A returned error is a tool failure: the
	// runtime turns it into an error result the model sees, and the turn goes
	// on. Call must stop promptly when ctx is done.
	Call(ctx context.Context, call ToolCall, progress func(ToolProgress)) (ToolOutput, error)
}

// ToolOutput is what a tool returns to the model.
type ToolOutput struct {
	// Content is the result as text (often JSON).
	Content string
	// IsError reports that the tool ran but failed; Content says why.
	IsError bool
	// Media is what the tool returned besides text (images, audio,
	// documents), shown to the model after Content.
	Media []Media
}

// ToolProgress is a progress report from a running tool.
type ToolProgress struct {
	// Message describes the current step; may be empty.
	Message string
	// Progress is the amount done so far.
	Progress float64
	// Total is the amount to do; zero when unknown.
	Total float64
}
