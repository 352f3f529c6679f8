package client_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
)

// TestMessagesOmittedAreRebuilt: when the server leaves turn_completed's
// messages out (too large for one event), Result still has every message
// the turn added, from its message_completed events.
func TestMessagesOmittedAreRebuilt(t *testing.T) {
	big := strings.Repeat("z", 40<<10)
	p := &scripted{fn: func(_ context.Context, call int, _ *llm.Request) iter.Seq2[llm.Chunk, error] {
		if call <= 2 {
			return callTool(fmt.Sprintf("c%d", call), "echo", `{}`)
		}
		return reply("done")
	}}
	echo := toolFunc{name: "echo", out: big}
	addr := serveWith(t, newReplica(t, p, echo), server.Options{MaxEventBytes: 64 << 10})
	c := newClient(t, addr)
	turn := c.RunTurn(t.Context(), userRequest("go"))
	evs, err := collect(t, turn)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1].Agent.GetTurnCompleted()
	if !last.GetMessagesOmitted() {
		t.Fatal("the server sent turn_completed's messages: the test does not test the rebuild")
	}
	res := turn.Result()
	var roles []string
	for _, m := range res.Messages {
		roles = append(roles, strings.TrimPrefix(m.GetRole().String(), "ROLE_"))
	}
	if got := strings.Join(roles, " "); got != "ASSISTANT TOOL ASSISTANT TOOL ASSISTANT" {
		t.Errorf("result messages: %s", got)
	}
	if got := res.Messages[1].GetParts()[0].GetToolResult().GetContent(); got != big {
		t.Errorf("tool result of %d bytes", len(got))
	}
}

// toolFunc is a server-side tool answering out.
type toolFunc struct{ name, out string }

func (f toolFunc) Spec() llm.ToolSpec {
	return llm.ToolSpec{Name: f.name, Description: "echo", ReadOnly: true}
}
func (f toolFunc) Call(context.Context, llm.ToolCall, func(llm.ToolProgress)) (llm.ToolOutput, error) {
	return llm.ToolOutput{Content: f.out}, nil
}

// TestBearerToken: the client sends its key; a server with keys refuses
// a client without one (UNAUTHENTICATED, not retried) and a key over its
// limit (LIMIT_EXCEEDED with the server's wait, returned when the wait is
// longer than the client is told to wait).
func TestBearerToken(t *testing.T) {
	one := 1
	key := server.Key{Name: "app", TokenSHA256: sha256.Sum256([]byte("s3cret-token")), Limits: server.KeyLimits{TurnsPerMinute: &one}}
	r := newReplica(t, &scripted{fn: func(context.Context, int, *llm.Request) iter.Seq2[llm.Chunk, error] { return reply("hi") }})
	addr := serveWith(t, r, server.Options{Keys: []server.Key{key}})

	_, err := newClient(t, addr).RunTurn(t.Context(), userRequest("hi")).Wait()
	var te *client.TurnError
	if !errors.As(err, &te) || te.Code != turnstilev1.ErrorCode_ERROR_CODE_UNAUTHENTICATED || te.Retryable || te.Attempts != 1 {
		t.Fatalf("without a key: %v", err)
	}

	c := newClient(t, addr, client.WithBearerToken("s3cret-token"), client.WithMaxRetryDelay(time.Second))
	if _, err := c.RunTurn(t.Context(), userRequest("hi")).Wait(); err != nil {
		t.Fatalf("with the key: %v", err)
	}
	if got := r.served()[0].auth; got != "Bearer s3cret-token" {
		t.Errorf("authorization sent: %q", got)
	}
	_, err = c.RunTurn(t.Context(), userRequest("again")).Wait()
	if !errors.As(err, &te) || te.Code != turnstilev1.ErrorCode_ERROR_CODE_LIMIT_EXCEEDED || !te.Retryable || te.RetryAfter < 30*time.Second {
		t.Fatalf("over the limit: %v (retryable %v, after %s)", err, te.Retryable, te.RetryAfter)
	}
}

// TestBearerTokenNeedsTLS: a token is not sent in plaintext unless the
// client was made WithInsecure.
func TestBearerTokenNeedsTLS(t *testing.T) {
	_, err := client.New("127.0.0.1:1", client.WithBearerToken("tok"), client.WithTransportCredentials(plaintextCreds()))
	if err == nil || !strings.Contains(err.Error(), "transport level security") {
		t.Errorf("a token over plaintext: %v", err)
	}
	c, err := client.New("127.0.0.1:1", client.WithBearerToken("tok"), client.WithInsecure())
	if err != nil {
		t.Errorf("a token over plaintext WithInsecure: %v", err)
	} else {
		c.Close()
	}
}

// plaintextCreds are transport credentials without TLS, given as if they
// were a TLS set-up.
func plaintextCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

// TestRequestTooLarge: a request over the server's max_request_bytes fails
// at once with REQUEST_TOO_LARGE, not retryable and not retried, whatever
// the client's step retries.
func TestRequestTooLarge(t *testing.T) {
	p := &scripted{fn: func(context.Context, int, *llm.Request) iter.Seq2[llm.Chunk, error] { return reply("never") }}
	addr := serveWith(t, newReplica(t, p), server.Options{MaxRequestBytes: 64 << 10})
	c := newClient(t, addr, client.WithMaxStepRetries(3))
	_, err := c.RunTurn(t.Context(), userRequest(strings.Repeat("w", 100<<10))).Wait()
	var te *client.TurnError
	if !errors.As(err, &te) || te.Code != turnstilev1.ErrorCode_ERROR_CODE_REQUEST_TOO_LARGE || te.Retryable || te.Attempts != 1 {
		t.Fatalf("error %v (%+v); want REQUEST_TOO_LARGE, not retryable, after one attempt", err, te)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls != 0 {
		t.Errorf("the model was called %d times", p.calls)
	}
}
