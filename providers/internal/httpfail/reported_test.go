package httpfail

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
)

// sameErr compares a [llm.Error]'s Err field by identity.
var sameErr = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" },
	cmp.Comparer(func(a, b error) bool { return a == b }))

func TestUntyped(t *testing.T) {
	t.Parallel()
	var syn json.SyntaxError
	tests := []struct {
		name string
		err  error
		kind llm.Kind
		msg  string
	}{
		{"transport", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), llm.KindNetwork, "connection closed before the response was complete"},
		{"malformed event", fmt.Errorf("decode: %w", &syn), llm.KindServerError, MalformedEvent},
		{"unknown", errors.New("something else"), llm.KindInternal, "unexpected failure calling the provider"},
	}
	for _, tt := range tests {
		e := Untyped("p", 200, "req", tt.err)
		want := &llm.Error{Kind: tt.kind, Message: tt.msg, Provider: "p", StatusCode: 200, RequestID: "req", Err: tt.err}
		if diff := cmp.Diff(want, e, sameErr); diff != "" {
			t.Errorf("%s: Untyped (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestWaits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		kind llm.Kind
		code int
		want bool
	}{
		{llm.KindRateLimited, 400, true},
		{llm.KindOverloaded, 200, true},
		{llm.KindQuotaExhausted, 429, true},
		{llm.KindServerError, 502, true},
		{llm.KindInvalidRequest, 400, false},
		{llm.KindServerError, 200, false},
	}
	for _, tt := range tests {
		if got := Waits(tt.kind, tt.code); got != tt.want {
			t.Errorf("Waits(%v, %d) = %v, want %v", tt.kind, tt.code, got, tt.want)
		}
	}
}

func TestReportedError(t *testing.T) {
	t.Parallel()
	const key = "sk-secret-0123456789"
	cause := errors.New("sdk error")
	h := http.Header{"X-Request-Id": {"req_h"}, "X-Should-Retry": {"false"}}
	tests := []struct {
		name string
		r    Reported
		want llm.Error
	}{
		{
			name: "message redacted, request id from the headers",
			r:    Reported{Kind: llm.KindAuth, Message: "bad key " + key + " with x-header-value-secret", StatusCode: 401, Header: h},
			want: llm.Error{Kind: llm.KindAuth, Message: "bad key [redacted] with [redacted]", StatusCode: 401, RequestID: "req_h", Hint: llm.HintNever},
		},
		{
			name: "own request id and wait",
			r:    Reported{Kind: llm.KindRateLimited, StatusCode: 429, RequestID: "req_own", RetryAfter: 2 * time.Second},
			want: llm.Error{Kind: llm.KindRateLimited, Message: "HTTP 429 Too Many Requests", StatusCode: 429, RequestID: "req_own",
				RetryAfter: 2 * time.Second, Hint: llm.HintAfter},
		},
		{
			name: "error event mid-stream without a message",
			r:    Reported{Kind: llm.KindServerError, StatusCode: 200},
			want: llm.Error{Kind: llm.KindServerError, Message: "the provider reported an error while streaming", StatusCode: 200},
		},
	}
	for _, tt := range tests {
		e := tt.r.Error("p", []string{"x-header-value-secret", key}, cause)
		want := tt.want
		want.Provider, want.Err = "p", cause
		if diff := cmp.Diff(&want, e, sameErr); diff != "" {
			t.Errorf("%s: Error (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestResponse(t *testing.T) {
	t.Parallel()
	if code, h := Response(nil); code != 0 || h != nil {
		t.Errorf("Response(nil) = %d, %v", code, h)
	}
	h := http.Header{"A": {"b"}}
	if code, got := Response(&http.Response{StatusCode: 503, Header: h}); code != 503 || got.Get("A") != "b" {
		t.Errorf("Response = %d, %v", code, got)
	}
}
