package runtime_test

import (
	"context"
	"testing"
	"time"

	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// forward is a CooldownSharer that applies every cooldown to another
// runner at once, as two replicas sharing a store do.
type forward struct{ to *runtime.Runner }

func (f forward) ShareCooldown(alias string, k llm.Kind, until time.Time) {
	f.to.ApplyCooldown(alias, k, until)
}

// TestSharedCooldown: a model one runner finds rate limited is skipped by
// another runner's next turn, which starts on the fallback.
func TestSharedCooldown(t *testing.T) {
	limited := func() *fake.Provider {
		return fake.NewProvider(fake.Reply{Err: providerErr(llm.KindRateLimited, 20*time.Second)})
	}
	replica := func(primary *fake.Provider) (*runtime.Runner, *fake.Provider) {
		backup := fake.NewProvider(fake.Reply{Chunks: fake.Text("from the fallback")})
		return newRunner(t, []*runtime.Model{model("primary", primary, "backup"), model("backup", backup)}, nil), backup
	}
	pa, pb := limited(), limited()
	a, _ := replica(pa)
	b, backupB := replica(pb)
	a.ShareCooldowns(forward{to: b})

	if _, res, te := run(t, context.Background(), a, userTurn("hi")); te != nil || res == nil {
		t.Fatalf("turn on a: %v", te)
	}
	if pa.Calls() != 1 {
		t.Fatalf("a's primary got %d calls, want 1", pa.Calls())
	}
	evs, _, te := run(t, context.Background(), b, userTurn("hi"))
	if te != nil {
		t.Fatalf("turn on b: %v", te)
	}
	if pb.Calls() != 0 || backupB.Calls() != 1 {
		t.Errorf("b's primary got %d calls and its fallback %d; want 0 and 1: %s", pb.Calls(), backupB.Calls(), describeAll(evs))
	}
	// An expired or unknown cooldown changes nothing.
	b.ApplyCooldown("nope", llm.KindRateLimited, time.Now().Add(time.Minute))
	b.ApplyCooldown("backup", llm.KindRateLimited, time.Now().Add(-time.Minute))
	if _, _, te := run(t, context.Background(), b, userTurn("hi")); te != nil || backupB.Calls() != 2 {
		t.Errorf("b after a stale cooldown: %v, fallback calls %d", te, backupB.Calls())
	}
}
