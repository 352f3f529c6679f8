package telemetry_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestDeploymentTelemetry checks a call moved to another deployment after
// a 429: each chat span and the call metrics name the deployment, the
// retry event says where the call moved, the cooldown is the failed
// deployment's, and the turn's log line lists each call's deployment.
func TestDeploymentTelemetry(t *testing.T) {
	p := newPipeline(t)
	var buf bytes.Buffer
	log := telemetry.NewTurnLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	limited := fake.NewProvider(fake.Reply{Err: &llm.Error{Kind: llm.KindRateLimited, Message: "slow down"}})
	ok := fake.NewProvider(fake.Reply{Chunks: fake.Text("fine")})
	m := &runtime.Model{Alias: "a", Retry: fastRetry(), Deployments: []runtime.Deployment{
		{Name: "east", ProviderName: "oai", Provider: limited, ID: "a-id"},
		{Name: "west", ProviderName: "oai", Provider: ok, ID: "a-id"},
	}}
	r, err := runtime.New([]*runtime.Model{m}, "a", nil, runtime.WithObserver(runtime.Observers(observer(t, p, telemetry.ObserverOptions{}), log)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(t.Context(), userTurn("hi"), runtime.SinkFunc(func(context.Context, runtime.Event) error { return nil })); err != nil {
		t.Fatal(err)
	}
	got := tree(p.spans.Ended(), "turnstile.model", "turnstile.deployment", "turnstile.retry.to_deployment", "error.type", "turnstile.cooldown")
	want := `invoke_agent [internal] turnstile.model=a
  @turnstile.retry turnstile.model=a error.type=RATE_LIMITED turnstile.attempt=1 turnstile.delay=0 turnstile.deployment=east turnstile.retry.to_deployment=west
  @turnstile.cooldown turnstile.model=a error.type=RATE_LIMITED turnstile.cooldown=60 turnstile.deployment=east
  chat a-id [client] turnstile.model=a turnstile.deployment=east error.type=RATE_LIMITED status=Error
  chat a-id [client] turnstile.model=a turnstile.deployment=west
`
	if got != want {
		t.Errorf("span tree:\n%s\nwant:\n%s", got, want)
	}
	attempts := strings.Join(points(t, p.metrics(t)["turnstile.attempts"]), "\n")
	for _, w := range []string{"error.type=RATE_LIMITED,", "turnstile.deployment=east,", "turnstile.deployment=west,"} {
		if !strings.Contains(attempts, w) {
			t.Errorf("turnstile.attempts:\n%s\nwant a point with %s", attempts, w)
		}
	}
	lines := logLines(t, &buf)
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1", len(lines))
	}
	if d, ok := lines[0]["deployments"].(map[string]any); !ok || d["a"] != "east,west" {
		t.Errorf("deployments = %#v, want {a: east,west}", lines[0]["deployments"])
	}
	if a, ok := lines[0]["attempts"].(map[string]any); !ok || a["a"] != float64(2) {
		t.Errorf("attempts = %#v, want {a: 2}", lines[0]["attempts"])
	}
}
