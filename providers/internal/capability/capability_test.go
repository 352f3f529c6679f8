package capability

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// want is what one case expects of the row its model takes.
type want struct {
	family     string
	thinking   llm.Thinking
	sampling   llm.Sampling
	oneSampler bool
	prefill    bool
	schemaWith bool
	signed     bool
	maxStop    string // "" no limit known, else the number
	maxTemp    string
	signer     string
	audio      bool
}

// TestTable holds one case per row: a model id of the row's family (dated
// or suffixed as the provider names its versions) and what the row says,
// from each provider's documentation of the model. A row without a case,
// or a case that reaches another row, fails.
func TestTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		provider, model string
		want            want
	}{
		// Anthropic. An unknown model is the newest family: adaptive
		// thinking only, no sampling options, no prefill.
		{Anthropic, "claude-opus-6", want{family: "", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-3-5-haiku-20241022", want{family: "claude-3-", thinking: llm.ThinkingNone, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-3-7-sonnet-20250219", want{family: "claude-3-7-sonnet", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-sonnet-4-0", want{family: "claude-sonnet-4-0", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-sonnet-4-20250514", want{family: "claude-sonnet-4-2025", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-0", want{family: "claude-opus-4-0", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-20250514", want{family: "claude-opus-4-2025", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-1-20250805", want{family: "claude-opus-4-1", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, oneSampler: true, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-sonnet-4-5-20250929", want{family: "claude-sonnet-4-5", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, oneSampler: true, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-haiku-4-5", want{family: "claude-haiku-4-5", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, oneSampler: true, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-5-20251101", want{family: "claude-opus-4-5", thinking: llm.ThinkingBudget, sampling: llm.SamplingUnlessReasoning, oneSampler: true, prefill: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-sonnet-4-6", want{family: "claude-sonnet-4-6", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingUnlessReasoning, oneSampler: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-6", want{family: "claude-opus-4-6", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingUnlessReasoning, oneSampler: true, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-7", want{family: "claude-opus-4-7", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-4-8", want{family: "claude-opus-4-8", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-opus-5-1", want{family: "claude-opus-5", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-sonnet-5", want{family: "claude-sonnet-5", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-haiku-5", want{family: "claude-haiku-5", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-mythos-preview", want{family: "claude-mythos", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},
		{Anthropic, "claude-fable-5", want{family: "claude-fable", thinking: llm.ThinkingAdaptive, sampling: llm.SamplingNever, schemaWith: true, maxTemp: "1", signer: Anthropic}},

		// Gemini: five stop sequences, temperature to 2, every input; an
		// output schema beside tools from Gemini 3 on.
		{Gemini, "gemini-exp-1206", want{family: "", thinking: llm.ThinkingBudget, maxStop: "5", maxTemp: "2", signer: Gemini, audio: true}},
		{Gemini, "gemini-1.5-pro", want{family: "gemini-1.5", thinking: llm.ThinkingNone, maxStop: "5", maxTemp: "2", signer: Gemini, audio: true}},
		{Gemini, "gemini-2.0-flash", want{family: "gemini-2.0", thinking: llm.ThinkingNone, maxStop: "5", maxTemp: "2", signer: Gemini, audio: true}},
		{Gemini, "models/gemini-2.5-flash", want{family: "gemini-2.5", thinking: llm.ThinkingBudget, maxStop: "5", maxTemp: "2", signer: Gemini, audio: true}},
		{Gemini, "gemini-3-pro-preview", want{family: "gemini-3", thinking: llm.ThinkingBudget, schemaWith: true, signed: true, maxStop: "5", maxTemp: "2", signer: Gemini, audio: true}},

		// OpenAI and the servers that speak its API.
		{OpenAI, "qwen3:8b", want{family: ""}},
		{OpenAI, "gpt-3.5-turbo", want{family: "gpt-3.5", thinking: llm.ThinkingNone, schemaWith: true, maxStop: "4", maxTemp: "2"}},
		{OpenAI, "gpt-4.1-mini", want{family: "gpt-4", thinking: llm.ThinkingNone, schemaWith: true, maxStop: "4", maxTemp: "2"}},
		{OpenAI, "gpt-4o-audio-preview", want{family: "gpt-4o-audio", thinking: llm.ThinkingNone, schemaWith: true, maxStop: "4", maxTemp: "2", audio: true}},
		{OpenAI, "gpt-4o-mini-audio-preview", want{family: "gpt-4o-mini-audio", thinking: llm.ThinkingNone, schemaWith: true, maxStop: "4", maxTemp: "2", audio: true}},
		{OpenAI, "gpt-audio-mini", want{family: "gpt-audio", thinking: llm.ThinkingNone, schemaWith: true, maxStop: "4", maxTemp: "2", audio: true}},
		{OpenAI, "o1-2024-12-17", want{family: "o1", sampling: llm.SamplingNever, schemaWith: true, maxStop: "0", maxTemp: "2"}},
		{OpenAI, "o3-mini", want{family: "o3", sampling: llm.SamplingNever, schemaWith: true, maxStop: "0", maxTemp: "2"}},
		{OpenAI, "o4-mini", want{family: "o4", sampling: llm.SamplingNever, schemaWith: true, maxStop: "0", maxTemp: "2"}},
		{OpenAI, "gpt-5-mini", want{family: "gpt-5", sampling: llm.SamplingNever, schemaWith: true, maxStop: "0", maxTemp: "2"}},
		{OpenAI, "openai/gpt-5.2", want{family: "gpt-5.", sampling: llm.SamplingUnlessReasoning, schemaWith: true, maxTemp: "2"}},
	}
	reached := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.provider+"/"+tc.model, func(t *testing.T) {
			r := Lookup(tc.provider, tc.model)
			got := want{
				family: r.Family, thinking: r.Thinking, sampling: r.Sampling, oneSampler: r.TemperatureOrTopP,
				prefill: r.Prefill, schemaWith: r.SchemaWithTools, signed: r.SignedCalls, maxStop: text(r.MaxStopSequences), maxTemp: text(r.MaxTemperature),
				signer: r.Signer, audio: slices.Contains(r.Inputs, llm.ModalityAudio),
			}
			if got != tc.want {
				t.Errorf("row\n got %+v\nwant %+v", got, tc.want)
			}
			if !slices.Contains(r.Inputs, llm.ModalityText) {
				t.Errorf("inputs %v lack text", r.Inputs)
			}
		})
		reached[tc.provider+"/"+tc.want.family] = true
	}
	for _, r := range Table {
		if !reached[r.Provider+"/"+r.Family] {
			t.Errorf("row %s %q has no case", r.Provider, r.Family)
		}
	}
}

func text[T int | float64](p *T) string {
	if p == nil {
		return ""
	}
	return fmt.Sprint(*p)
}

// TestRowsAreDistinct: no provider names a family twice, each has a
// default row, and a lookup's limits are its own copies.
func TestRowsAreDistinct(t *testing.T) {
	t.Parallel()
	seen := map[[2]string]bool{}
	for _, r := range Table {
		k := [2]string{r.Provider, r.Family}
		if seen[k] {
			t.Errorf("%s %q twice", r.Provider, r.Family)
		}
		seen[k] = true
	}
	for _, p := range []string{Anthropic, Gemini, OpenAI} {
		if !seen[[2]string{p, ""}] {
			t.Errorf("%s has no default row", p)
		}
	}
	a := Lookup(Gemini, "gemini-2.5-pro")
	*a.MaxStopSequences = 99
	a.Inputs[0] = llm.ModalityAudio
	if b := Lookup(Gemini, "gemini-2.5-pro"); *b.MaxStopSequences != 5 || b.Inputs[0] != llm.ModalityText {
		t.Errorf("a lookup changed the table: %+v", b)
	}
	if r := Lookup("simulator", "any"); r.Capabilities != (llm.Capabilities{}) || r.Inputs != nil {
		t.Errorf("a provider without rows: %+v", r)
	}
}

// TestREADMETable: providers/README.md's table names every family of the
// table under its provider, and no family the table does not have.
func TestREADMETable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[[2]string]bool{}
	for line := range strings.Lines(string(b)) {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !slices.Contains([]string{Anthropic, Gemini, OpenAI}, strings.TrimSpace(cells[1])) {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[2], -1) {
			documented[[2]string{strings.TrimSpace(cells[1]), m[1]}] = true
		}
	}
	for _, r := range Table {
		k := [2]string{r.Provider, r.Family}
		if r.Family != "" && !documented[k] {
			t.Errorf("README.md does not name %s %q", r.Provider, r.Family)
		}
		delete(documented, k)
	}
	for k := range documented {
		t.Errorf("README.md names %s %q, which the table does not have", k[0], k[1])
	}
}
