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
