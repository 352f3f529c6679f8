// Package clock is a built-in server-side tool that tells the current date
// and time in a time zone. It is small on purpose: it lets a fresh install
// show a real tool call end to end with no external server.
package clock

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	_ "time/tzdata" // zone names work in minimal containers too

	"github.com/turnstile-dev/turnstile/llm"
)

// Name is the tool's name as the model sees it.
const Name = "current_time"

// Tool reports the current time. The zero value uses time.Now.
type Tool struct {
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

var _ llm.Tool = Tool{}

// Spec describes the tool: read-only and idempotent, so retries never
// worry about it.
func (Tool) Spec() llm.ToolSpec {
	return llm.ToolSpec{
		Name:        Name,
		Description: "Returns the current date and time in an IANA time zone (default UTC).",
		Schema:      json.RawMessage(`{"type":"object","properties":{"zone":{"type":"string","description":"IANA time zone name, e.g. Europe/Paris"}},"additionalProperties":false}`),
		ReadOnly:    true,
		Idempotent:  true,
	}
}

// Call returns {"time": RFC 3339, "zone": name, "weekday": name}. An unknown
// zone is an error result the model can correct.
func (t Tool) Call(_ context.Context, call llm.ToolCall, _ func(llm.ToolProgress)) (llm.ToolOutput, error) {
	var args struct {
		Zone string `json:"zone"`
	}
	if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil {
		return llm.ToolOutput{IsError: true, Content: "arguments must be a JSON object like {\"zone\":\"UTC\"}"}, nil
	}
	if args.Zone == "" {
		args.Zone = "UTC"
	}
	loc, err := time.LoadLocation(args.Zone)
	if err != nil {
		return llm.ToolOutput{IsError: true, Content: fmt.Sprintf("unknown time zone %q; use an IANA name such as UTC or Europe/Paris", args.Zone)}, nil
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	at := now().In(loc)
	b, _ := json.Marshal(map[string]string{"time": at.Format(time.RFC3339), "zone": args.Zone, "weekday": at.Weekday().String()})
	return llm.ToolOutput{Content: string(b)}, nil
}
