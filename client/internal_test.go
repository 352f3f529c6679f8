package client

import (
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

func statusErr(c codes.Code, details ...protoadapt.MessageV1) error {
	st, err := status.New(c, "msg").WithDetails(details...)
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func TestFromStatus(t *testing.T) {
	info := func(reason string) *errdetails.ErrorInfo {
		return &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"model": "m"}}
	}
	retry := &errdetails.RetryInfo{RetryDelay: durationpb.New(2 * time.Second)}
	tests := []struct {
		name      string
		err       error
		code      turnstilev1.ErrorCode
		retry     bool
		transport bool
		after     time.Duration
	}{
		{"transport unavailable", status.Error(codes.Unavailable, "connection reset"), turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE, true, true, 0},
		{"server retryable", statusErr(codes.Unavailable, info("OVERLOADED"), retry), turnstilev1.ErrorCode_ERROR_CODE_OVERLOADED, true, false, 2 * time.Second},
		{"server draining", statusErr(codes.Unavailable, info("UNAVAILABLE"), retry), turnstilev1.ErrorCode_ERROR_CODE_UNAVAILABLE, true, false, 2 * time.Second},
		{"server not retryable", statusErr(codes.Unavailable, info("SERVER_ERROR")), turnstilev1.ErrorCode_ERROR_CODE_SERVER_ERROR, false, false, 0},
		{"rate limited", statusErr(codes.ResourceExhausted, info("RATE_LIMITED"), retry), turnstilev1.ErrorCode_ERROR_CODE_RATE_LIMITED, true, false, 2 * time.Second},
		{"quota", statusErr(codes.ResourceExhausted, info("QUOTA_EXHAUSTED")), turnstilev1.ErrorCode_ERROR_CODE_QUOTA_EXHAUSTED, false, false, 0},
		{"invalid argument", statusErr(codes.InvalidArgument, info("INVALID_REQUEST")), turnstilev1.ErrorCode_ERROR_CODE_INVALID_REQUEST, false, false, 0},
		{"unknown reason", statusErr(codes.Internal, info("SOMETHING_NEW")), turnstilev1.ErrorCode_ERROR_CODE_INTERNAL, false, false, 0},
		{"other domain", statusErr(codes.Internal, &errdetails.ErrorInfo{Reason: "X", Domain: "example.com"}), turnstilev1.ErrorCode_ERROR_CODE_INTERNAL, false, false, 0},
		{"internal", status.Error(codes.Internal, "stream terminated by RST_STREAM"), turnstilev1.ErrorCode_ERROR_CODE_INTERNAL, false, false, 0},
		{"unauthenticated", status.Error(codes.Unauthenticated, "no token"), turnstilev1.ErrorCode_ERROR_CODE_AUTH, false, false, 0},
		{"unimplemented", status.Error(codes.Unimplemented, "unknown service"), turnstilev1.ErrorCode_ERROR_CODE_NOT_FOUND, false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fromStatus(tt.err)
			if f.err.Code != tt.code || f.retry != tt.retry || f.transport != tt.transport || f.err.RetryAfter != tt.after {
				t.Errorf("fromStatus(%v) = code %v retry %v transport %v after %v, want %v %v %v %v",
					tt.err, f.err.Code, f.retry, f.transport, f.err.RetryAfter, tt.code, tt.retry, tt.transport, tt.after)
			}
			if f.err.Retryable != tt.retry {
				t.Errorf("Retryable = %v, want %v", f.err.Retryable, tt.retry)
			}
			if !errors.Is(f.err, tt.err) {
				t.Errorf("the TurnError does not wrap the status error")
			}
		})
	}
}

func TestFromErrorEvent(t *testing.T) {
	yes, no := true, false
	for _, tt := range []struct {
		retryable *bool
		want      bool
	}{{nil, false}, {&no, false}, {&yes, true}} {
		f := fromErrorEvent(&turnstilev1.Error{Code: turnstilev1.ErrorCode_ERROR_CODE_TIMEOUT, Retryable: tt.retryable, RetryAfter: durationpb.New(time.Second)})
		if f.retry != tt.want || f.err.RetryAfter != time.Second {
			t.Errorf("retryable %v: retry = %v (after %v), want %v", tt.retryable, f.retry, f.err.RetryAfter, tt.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.5}
	for _, tt := range []struct {
		n    int
		u    float64
		want time.Duration
	}{
		{1, 0.5, 100 * time.Millisecond},
		{2, 0.5, 200 * time.Millisecond},
		{4, 0.5, 800 * time.Millisecond},
		{5, 0.5, time.Second},
		{50, 0.5, time.Second},
		{1, 0, 50 * time.Millisecond},
		{5, 0.999999, 1500 * time.Millisecond},
	} {
		if got := b.delay(tt.n, tt.u); got.Round(time.Millisecond) != tt.want {
			t.Errorf("delay(%d, %v) = %v, want %v", tt.n, tt.u, got, tt.want)
		}
	}
}

func TestAddressList(t *testing.T) {
	for _, tt := range []struct {
		target string
		want   []string
	}{
		{"127.0.0.1:7700", nil},
		{"dns:///turnstile:7700", nil},
		{"a:1,b:2", []string{"a:1", "b:2"}},
		{" a:1 , b:2 ,", []string{"a:1", "b:2"}},
	} {
		got, ok := addressList(tt.target)
		if ok != (tt.want != nil) || !slices.Equal(got, tt.want) {
			t.Errorf("addressList(%q) = %v, %v, want %v", tt.target, got, ok, tt.want)
		}
	}
}

func TestStanding(t *testing.T) {
	text := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}}}
	call := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_ASSISTANT, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolCall{ToolCall: &turnstilev1.ToolCall{Id: "1", Name: "t"}}}}}
	result := &turnstilev1.Message{Role: turnstilev1.Role_ROLE_TOOL, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_ToolResult{ToolResult: &turnstilev1.ToolResult{CallId: "1"}}}}}
	for _, tt := range []struct {
		in   []*turnstilev1.Message
		want int
	}{
		{nil, 0},
		{[]*turnstilev1.Message{text}, 1},
		{[]*turnstilev1.Message{call, result}, 2},
		{[]*turnstilev1.Message{call, result, call}, 2},
	} {
		if got := standing(tt.in); len(got) != tt.want {
			t.Errorf("standing(%d messages) kept %d, want %d", len(tt.in), len(got), tt.want)
		}
	}
}

func TestNewRejects(t *testing.T) {
	for name, opts := range map[string][]Option{
		"negative retries":           {WithInsecure(), WithMaxStepRetries(-1)},
		"bad jitter":                 {WithInsecure(), WithBackoff(Backoff{Jitter: 2})},
		"insecure and tls":           {WithInsecure(), WithTLS(nil)},
		"negative re-attaches":       {WithInsecure(), WithMaxReattaches(-1)},
		"negative re-attach timeout": {WithInsecure(), WithReattachTimeout(-time.Second)},
		"negative cancel timeout":    {WithInsecure(), WithCancelTimeout(-time.Second)},
	} {
		if _, err := New("127.0.0.1:1", opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := New(""); err == nil {
		t.Error("empty target: New succeeded")
	}
}

// The defaults: re-attach for 30s with no cap on the count, cancel within
// 2s; the deprecated count still caps.
func TestReattachAndCancelDefaults(t *testing.T) {
	c, err := New("127.0.0.1:1", WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o := c.opts; o.reattachFor != 30*time.Second || o.capReattaches || o.cancelWait != 2*time.Second {
		t.Errorf("reattach timeout %v, count capped %v, cancel timeout %v; want 30s, false, 2s", o.reattachFor, o.capReattaches, o.cancelWait)
	}
	c2, err := New("127.0.0.1:1", WithInsecure(), WithMaxReattaches(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if o := c2.opts; !o.capReattaches || o.maxReattaches != 3 || o.reattachFor != 30*time.Second {
		t.Errorf("with WithMaxReattaches(3): cap %v %d, timeout %v", o.capReattaches, o.maxReattaches, o.reattachFor)
	}
}

// TestEveryReasonHasItsCode walks the ErrorCode enum: the server's
// ErrorInfo reason for each code is the code's name without its prefix
// (server.codeReason), and the client reads each back as that code, so a
// code added to the contract is never read as INTERNAL.
func TestEveryReasonHasItsCode(t *testing.T) {
	for v, name := range turnstilev1.ErrorCode_name {
		code := turnstilev1.ErrorCode(v)
		if code == turnstilev1.ErrorCode_ERROR_CODE_UNSPECIFIED {
			continue
		}
		reason := name[len("ERROR_CODE_"):]
		f := fromStatus(statusErr(codes.ResourceExhausted, &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}))
		var te *TurnError
		if !errors.As(f.err, &te) || te.Code != code {
			t.Errorf("reason %s read as %v, want %v", reason, te.Code, code)
		}
	}
}
