// Package capability is the one table of what each model the adapters
// know can take, keyed by provider and model family: how it reasons, when
// it takes temperature and top_p, whether it continues a trailing
// assistant message (prefill), whether it takes an output schema beside
// tools, the limits of its stop sequences and temperature, whose thinking
// signatures it reads, and its kinds of input.
//
// Each adapter answers [llm.Capabilities] and its inputs from here, and
// builds its requests by them; the runtime asks the adapter (its
// Capabilities and Inputs methods) and checks a request before the call.
// A model the table does not know takes its provider's default row; the
// configuration (models.ALIAS.capabilities and .input) overrides a row
// for a fine-tuned or newer model.
//
// The rows follow each provider's documentation of its current models;
// capability_test.go holds one case per row.
//
// The package imports only the standard library and llm.
package capability

import (
	"slices"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// The providers of the table: the adapters' types.
const (
	Anthropic = "anthropic"
	Gemini    = "gemini"
	OpenAI    = "openai"
)

// Row is one line of the table: what the models of one provider whose ids
// start with Family take. The row of an empty Family is the provider's
// default, for the models no other row names.
type Row struct {
	Provider string
	Family   string
	// Inputs lists the kinds of input the models take.
	Inputs []llm.Modality
	llm.Capabilities
}

var (
	textImagePDF = []llm.Modality{llm.ModalityText, llm.ModalityImage, llm.ModalityPDF}
	withAudio    = []llm.Modality{llm.ModalityText, llm.ModalityImage, llm.ModalityPDF, llm.ModalityAudio}
)

// claude returns the row of a Claude family: the Messages API's
// temperature range (0 to 1), its images and PDFs, and its own
// signatures, over c.
func claude(family string, c llm.Capabilities) Row {
	c.MaxTemperature = new(1.0)
	c.Signer = Anthropic
	return Row{Provider: Anthropic, Family: family, Inputs: textImagePDF, Capabilities: c}
}

// gemini returns the row of a Gemini family: the Gemini API's five stop
// sequences, temperature range (0 to 2), every kind of input, and its own
// signatures, over c.
func gemini(family string, c llm.Capabilities) Row {
	c.MaxStopSequences = new(5)
	c.MaxTemperature = new(2.0)
	c.Signer = Gemini
	return Row{Provider: Gemini, Family: family, Inputs: llm.Modalities, Capabilities: c}
}

// openAI returns the row of an OpenAI family: Chat Completions'
// temperature range (0 to 2) and its images and PDF files, over c.
func openAI(family string, c llm.Capabilities, in []llm.Modality) Row {
	c.MaxTemperature = new(2.0)
	return Row{Provider: OpenAI, Family: family, Inputs: in, Capabilities: c}
}

// The Claude models' ways, oldest first.
var (
	// claudeNoThinking: Claude 3 and 3.5, which take prefill and no
	// thinking.
	claudeNoThinking = llm.Capabilities{Thinking: llm.ThinkingNone, Prefill: true, SchemaWithTools: true}
	// claudeBudget: Claude 3.7 and 4.0, thinking by budget_tokens (no
	// temperature with it), prefill.
	claudeBudget = llm.Capabilities{Thinking: llm.ThinkingBudget, Sampling: llm.SamplingUnlessReasoning, Prefill: true, SchemaWithTools: true}
	// claudeOneSampler: Claude Opus 4.1 and the 4.5 family, as 4.0 but
	// temperature or top_p, not both.
	claudeOneSampler = llm.Capabilities{Thinking: llm.ThinkingBudget, Sampling: llm.SamplingUnlessReasoning, TemperatureOrTopP: true, Prefill: true, SchemaWithTools: true}
	// claudeAdaptive: the 4.6 family, adaptive thinking (budget_tokens is
	// deprecated there), no prefill (a 400).
	claudeAdaptive = llm.Capabilities{Thinking: llm.ThinkingAdaptive, Sampling: llm.SamplingUnlessReasoning, TemperatureOrTopP: true, SchemaWithTools: true}
	// claudeAdaptiveOnly: Opus 4.7, 4.8 and the 5 family, adaptive
	// thinking only, no temperature, top_p or prefill (each a 400).
	claudeAdaptiveOnly = llm.Capabilities{Thinking: llm.ThinkingAdaptive, Sampling: llm.SamplingNever, SchemaWithTools: true}
)

// The OpenAI models' ways.
var (
	// gptChat: the GPT-4 family, which does not reason, and takes four
	// stop sequences.
	gptChat = llm.Capabilities{Thinking: llm.ThinkingNone, MaxStopSequences: new(4), SchemaWithTools: true}
	// reasoner: the o-series and GPT-5, which always reason: no
	// temperature or top_p but the default, no stop sequences.
	reasoner = llm.Capabilities{Sampling: llm.SamplingNever, MaxStopSequences: new(0), SchemaWithTools: true}
	// gpt5x: GPT-5.1 and later, which reason only when asked (their
	// default effort is none) and take temperature and top_p only then.
	gpt5x = llm.Capabilities{Sampling: llm.SamplingUnlessReasoning, SchemaWithTools: true}
)

// Table is every row, by provider. Within a provider the row of the
// longest Family the model id starts with applies.
var Table = []Row{
	// An unknown Claude model is taken as the newest family: what a model
	// the table does not know most likely is.
	claude("", claudeAdaptiveOnly),
	claude("claude-3-", claudeNoThinking),
	claude("claude-3-7-sonnet", claudeBudget),
	claude("claude-sonnet-4-0", claudeBudget),
	claude("claude-sonnet-4-2025", claudeBudget),
	claude("claude-opus-4-0", claudeBudget),
	claude("claude-opus-4-2025", claudeBudget),
	claude("claude-opus-4-1", claudeOneSampler),
	claude("claude-sonnet-4-5", claudeOneSampler),
	claude("claude-haiku-4-5", claudeOneSampler),
	claude("claude-opus-4-5", claudeOneSampler),
	claude("claude-sonnet-4-6", claudeAdaptive),
	claude("claude-opus-4-6", claudeAdaptive),
	claude("claude-opus-4-7", claudeAdaptiveOnly),
	claude("claude-opus-4-8", claudeAdaptiveOnly),
	claude("claude-opus-5", claudeAdaptiveOnly),
	claude("claude-sonnet-5", claudeAdaptiveOnly),
	claude("claude-haiku-5", claudeAdaptiveOnly),
	claude("claude-mythos", claudeAdaptiveOnly),
	claude("claude-fable", claudeAdaptiveOnly),

	// Gemini 2.5 and earlier refuse function calling with a JSON response
	// type; Gemini 3 takes both. An unknown Gemini model is asked for its
	// schema the way every Gemini model takes.
	gemini("", llm.Capabilities{Thinking: llm.ThinkingBudget}),
	gemini("gemini-1.5", llm.Capabilities{Thinking: llm.ThinkingNone}),
	gemini("gemini-2.0", llm.Capabilities{Thinking: llm.ThinkingNone}),
	gemini("gemini-2.5", llm.Capabilities{Thinking: llm.ThinkingBudget}),
	// Gemini 3 refuses a function call of the current turn without a
	// thought signature.
	gemini("gemini-3", llm.Capabilities{Thinking: llm.ThinkingBudget, SchemaWithTools: true, SignedCalls: true}),

	// The OpenAI adapter also serves compatible servers (vLLM, Ollama,
	// ...), whose models the table does not know: its default row knows
	// nothing but their inputs.
	{Provider: OpenAI, Inputs: textImagePDF},
	openAI("gpt-3.5", gptChat, textImagePDF),
	openAI("gpt-4", gptChat, textImagePDF),
	openAI("gpt-4o-audio", gptChat, withAudio),
	openAI("gpt-4o-mini-audio", gptChat, withAudio),
	openAI("gpt-audio", gptChat, withAudio),
	openAI("o1", reasoner, textImagePDF),
	openAI("o3", reasoner, textImagePDF),
	openAI("o4", reasoner, textImagePDF),
	openAI("gpt-5", reasoner, textImagePDF),
	openAI("gpt-5.", gpt5x, textImagePDF),
}

// Lookup returns the row of provider's model: the row of the longest
// family its id starts with, else the provider's default row. The id is
// read without a leading path ("models/gemini-2.5-flash", a router's
// "openai/gpt-5") and in lower case.
func Lookup(provider, model string) Row {
	id := strings.ToLower(model[strings.LastIndexByte(model, '/')+1:])
	best := -1
	for i, r := range Table {
		if r.Provider != provider || !strings.HasPrefix(id, r.Family) {
			continue
		}
		if best < 0 || len(r.Family) > len(Table[best].Family) {
			best = i
		}
	}
	if best < 0 {
		return Row{Provider: provider}
	}
	r := Table[best]
	r.Inputs = slices.Clone(r.Inputs)
	if n := r.MaxStopSequences; n != nil {
		r.MaxStopSequences = new(*n)
	}
	if t := r.MaxTemperature; t != nil {
		r.MaxTemperature = new(*t)
	}
	return r
}
