package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/turnstile-dev/turnstile/llm"
)

// TestSnapshot follows two models through failures, a cooldown and a
// probe, and asserts what Snapshot and CoolingDown report at each point.
func TestSnapshot(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := NewHealth(map[string]Retry{
		"b": {BudgetTokens: 10, BudgetRatio: 0.5},
		"a": {BudgetTokens: 4, BudgetRatio: 1},
	})
	want := []ModelHealth{
		{Alias: "a", BudgetTokens: 4, BudgetMax: 4},
		{Alias: "b", BudgetTokens: 10, BudgetMax: 10},
	}
	if diff := cmp.Diff(want, h.Snapshot()); diff != "" {
		t.Fatalf("fresh snapshot (-want +got):\n%s", diff)
	}

	h.Failure("a", llm.KindOverloaded)
	h.Failure("a", llm.KindInvalidRequest) // not transient: spends nothing
	h.Cooldown("a", llm.KindOverloaded, t0, 30*time.Second)
	h.Failure("b", llm.KindRateLimited)
	h.Success("b")
	want = []ModelHealth{
		{Alias: "a", BudgetTokens: 3, BudgetMax: 4, CooldownUntil: t0.Add(30 * time.Second), CooldownKind: llm.KindOverloaded},
		{Alias: "b", BudgetTokens: 9.5, BudgetMax: 10},
	}
	got := h.Snapshot()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("snapshot after failures (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		at   time.Time
		want bool
	}{{t0, true}, {t0.Add(29 * time.Second), true}, {t0.Add(30 * time.Second), false}} {
		if c := got[0].CoolingDown(tt.at); c != tt.want {
			t.Errorf("a.CoolingDown(t0+%v) = %v, want %v", tt.at.Sub(t0), c, tt.want)
		}
	}
	if got[1].CoolingDown(t0) {
		t.Error("b is cooling down without a cooldown")
	}

	// Once the cooldown ended, one turn probes: the model is still skipped
	// by the others until the probe reports.
	if a := h.Admit("a", t0.Add(31*time.Second)); !a.Probe {
		t.Fatalf("Admit after the cooldown = %+v, want a probe", a)
	}
	probing := h.Snapshot()[0]
	if !probing.Probing || !probing.CoolingDown(t0.Add(31*time.Second)) {
		t.Errorf("a while probed = %+v, CoolingDown %v; want probing and skipped", probing, probing.CoolingDown(t0.Add(31*time.Second)))
	}
	h.Success("a")
	if a := h.Snapshot()[0]; a.CoolingDown(t0.Add(31*time.Second)) || a.BudgetTokens != 4 {
		t.Errorf("a after a successful probe = %+v, want healthy with a full budget", a)
	}

	// A copy: changing it changes nothing.
	got[0].BudgetTokens = 0
	if h.Snapshot()[0].BudgetTokens == 0 {
		t.Error("Snapshot shares state with Health")
	}
}
