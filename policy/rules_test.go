package policy_test

import (
	"os"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/policy"
)

// TestEveryKindHasARule keeps the table complete: a class added to llm
// must be given a rule here.
func TestEveryKindHasARule(t *testing.T) {
	have := map[llm.Kind]bool{}
	for _, k := range policy.Kinds() {
		have[k] = true
	}
	for _, k := range llm.Kinds() {
		if !have[k] {
			t.Errorf("class %s has no rule in policy's table", k)
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// TestDocsClassTable holds the class table of docs/retries.md and the
// code's rule table to each other, row by row and cell by cell.
func TestDocsClassTable(t *testing.T) {
	b, err := os.ReadFile("../docs/retries.md")
	if err != nil {
		t.Fatal(err)
	}
	const header = "| class | transient, client may retry | retried on the same model | falls back | cools the model down | compacts | after streamed output |"
	_, table, ok := strings.Cut(string(b), header+"\n")
	if !ok {
		t.Fatalf("docs/retries.md has no class table starting with:\n%s", header)
	}
	rows := map[string][]string{}
	for i, line := range strings.Split(table, "\n") {
		if i == 0 {
			continue // the |---| line
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows[strings.Trim(cells[0], "`")] = cells[1:]
	}
	for _, k := range policy.Kinds() {
		r := policy.RuleFor(k)
		after := "—"
		if r.AfterOutput != 0 {
			after = "`" + r.AfterOutput.String() + "`"
		}
		want := []string{yesNo(r.ClientRetryable()), yesNo(r.Retry), r.Fallback.String(), yesNo(r.CoolsDown), yesNo(r.Compacts), after}
		got, ok := rows[k.String()]
		if !ok {
			t.Errorf("docs/retries.md's class table has no row for %s; want | `%s` | %s |", k, k, strings.Join(want, " | "))
			continue
		}
		delete(rows, k.String())
		if strings.Join(got, " | ") != strings.Join(want, " | ") {
			t.Errorf("docs/retries.md row %s = | %s |, the code says | %s |", k, strings.Join(got, " | "), strings.Join(want, " | "))
		}
	}
	for class := range rows {
		t.Errorf("docs/retries.md's class table has a row for %s, which the code does not know", class)
	}
}

func TestClassifyAndAdvise(t *testing.T) {
	if got := policy.Classify(llm.KindNetwork, true); got != llm.KindStreamInterrupted {
		t.Errorf("Classify(NETWORK, streamed) = %s", got)
	}
	if got := policy.Classify(llm.KindNetwork, false); got != llm.KindNetwork {
		t.Errorf("Classify(NETWORK, not streamed) = %s", got)
	}
	if got := policy.Classify(llm.KindOverloaded, true); got != llm.KindOverloaded {
		t.Errorf("Classify(OVERLOADED, streamed) = %s", got)
	}
	tests := []struct {
		kind   llm.Kind
		unsafe bool
		want   policy.Advice
	}{
		{llm.KindOverloaded, false, policy.Advice{Kind: llm.KindOverloaded, Retryable: true}},
		{llm.KindOverloaded, true, policy.Advice{Kind: llm.KindToolsUnsafe}},
		{llm.KindAuth, true, policy.Advice{Kind: llm.KindAuth}},
		{llm.KindCancelled, false, policy.Advice{Kind: llm.KindCancelled}},
		{llm.KindUnavailable, false, policy.Advice{Kind: llm.KindUnavailable, Retryable: true}},
		{llm.Kind(200), false, policy.Advice{Kind: llm.Kind(200)}},
	}
	for _, tt := range tests {
		if got := policy.Advise(tt.kind, tt.unsafe); got != tt.want {
			t.Errorf("Advise(%s, %v) = %+v, want %+v", tt.kind, tt.unsafe, got, tt.want)
		}
	}
}
