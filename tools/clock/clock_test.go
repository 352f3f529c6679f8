package clock

import (
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

func TestCall(t *testing.T) {
	fixed := time.Date(2026, 11, 21, 23, 30, 0, 0, time.UTC)
	tool := Tool{Now: func() time.Time { return fixed }}
	tests := []struct {
		name, args, want string
		isError          bool
	}{
		{"default zone", `{}`, `{"time":"2026-11-21T23:30:00Z","weekday":"Saturday","zone":"UTC"}`, false},
		{"named zone", `{"zone":"Asia/Tokyo"}`, `{"time":"2026-11-22T08:30:00+09:00","weekday":"Sunday","zone":"Asia/Tokyo"}`, false},
		{"unknown zone", `{"zone":"Mars/Olympus"}`, `unknown time zone "Mars/Olympus"; use an IANA name such as UTC or Europe/Paris`, true},
		{"not an object", `[1]`, `arguments must be a JSON object like {"zone":"UTC"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := tool.Call(t.Context(), llm.ToolCall{Name: Name, Arguments: tt.args}, nil)
			if err != nil {
				t.Fatalf("Call: %v", err)
			}
			if out.Content != tt.want || out.IsError != tt.isError {
				t.Errorf("Call(%s) = %q (error %v), want %q (error %v)", tt.args, out.Content, out.IsError, tt.want, tt.isError)
			}
		})
	}
}

// TestErrorResultIsTheSameEveryDay: the clients' conformance scenario that
// checks a turn's exact cost (clients/conformance/scenarios.json) calls the
// tool with a zone that does not exist, because its result then has the
// same bytes on every day of the week; a real answer names the weekday.
func TestErrorResultIsTheSameEveryDay(t *testing.T) {
	first := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC) // a Monday
	var want string
	for day := range 7 {
		now := first.AddDate(0, 0, day)
		out, err := Tool{Now: func() time.Time { return now }}.Call(t.Context(), llm.ToolCall{Name: Name, Arguments: `{"zone":"Nope"}`}, nil)
		if err != nil || !out.IsError {
			t.Fatalf("%s: Call = %+v, %v; want an error result", now.Weekday(), out, err)
		}
		if day == 0 {
			want = out.Content
		} else if out.Content != want {
			t.Errorf("%s: %q, want Monday's %q", now.Weekday(), out.Content, want)
		}
	}
}
