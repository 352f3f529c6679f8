package runtime

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/turnstile-dev/turnstile/llm"
)

// Capable is a provider that says what each of its models can take (its
// table of [llm.Capabilities]). The runtime checks a request against it
// before the turn, continues a cut reply by it, and passes it, with the
// model's configuration over it ([Model].Capabilities), on every
// [llm.Request]. A provider that does not implement it knows nothing of
// its models: the zero Capabilities.
type Capable interface {
	Capabilities(model string) llm.Capabilities
}

// CapabilitiesConfig overrides what the table of a model's provider says
// it takes, for a model the table does not know (a fine-tuned or newer
// model) or knows wrong: the configuration's models.ALIAS.capabilities.
// A key left out keeps the table's value.
type CapabilitiesConfig struct {
	// Thinking is how the model takes reasoning: budget (a token budget:
	// Anthropic's thinking budget_tokens, Gemini's thinkingBudget),
	// adaptive (the model decides, at an effort: Anthropic's adaptive
	// thinking, Gemini's thinkingLevel), none (it does not reason:
	// reasoning is not sent) or default (the provider's usual way).
	Thinking string `yaml:"thinking"`
	// Sampling says when the model takes temperature and top_p: always,
	// unless_reasoning (not on a call that reasons: they are not sent
	// then) or never (they are never sent).
	Sampling string `yaml:"sampling"`
	// TemperatureOrTopP, when true, says the model refuses temperature and
	// top_p together: a request setting both is refused.
	TemperatureOrTopP *bool `yaml:"temperature_or_top_p"`
	// Prefill, when true, says the model continues a conversation that
	// ends with an assistant message from where its text ends, which is
	// how a reply cut short is then continued; false follows the cut reply
	// with a continuation prompt.
	Prefill *bool `yaml:"prefill"`
	// SchemaWithTools, when true, says the model takes an output schema
	// in a request that offers tools; false asks for the schema another
	// way then (Gemini: a respond function).
	SchemaWithTools *bool `yaml:"schema_with_tools"`
	// SignedCalls, when true, says the model refuses a function call of
	// the current turn without a thought signature (Gemini 3): a call
	// another model made is sent with the API's placeholder signature.
	SignedCalls *bool `yaml:"signed_calls"`
	// MaxStopSequences is the most stop sequences the model takes (0:
	// none); a request with more is refused.
	MaxStopSequences *int `yaml:"max_stop_sequences"`
	// MaxTemperature is the highest temperature the model takes, from 0 to
	// 2; a request above it is refused.
	MaxTemperature *float64 `yaml:"max_temperature"`
}

// Problems lists what is out of range in c.
func (c CapabilitiesConfig) Problems() []llm.Problem {
	var out []llm.Problem
	if _, ok := parseThinking(c.Thinking); !ok {
		out = append(out, llm.Problem{Field: "thinking", Message: fmt.Sprintf("%q is not %s", c.Thinking, oneOf(llm.Thinkings))})
	}
	if _, ok := parseSampling(c.Sampling); !ok {
		out = append(out, llm.Problem{Field: "sampling", Message: fmt.Sprintf("%q is not %s", c.Sampling, oneOf(llm.Samplings))})
	}
	if n := c.MaxStopSequences; n != nil && *n < 0 {
		out = append(out, llm.Problem{Field: "max_stop_sequences", Message: "must not be negative (0: the model takes none)"})
	}
	if t := c.MaxTemperature; t != nil && !(*t >= 0 && *t <= 2) {
		out = append(out, llm.Problem{Field: "max_temperature", Message: "must be from 0 to 2"})
	}
	return out
}

// apply returns caps with the keys c sets replaced.
func (c *CapabilitiesConfig) apply(caps llm.Capabilities) llm.Capabilities {
	if c == nil {
		return caps
	}
	if t, ok := parseThinking(c.Thinking); ok && c.Thinking != "" {
		caps.Thinking = t
	}
	if s, ok := parseSampling(c.Sampling); ok && c.Sampling != "" {
		caps.Sampling = s
	}
	if c.TemperatureOrTopP != nil {
		caps.TemperatureOrTopP = *c.TemperatureOrTopP
	}
	if c.Prefill != nil {
		caps.Prefill = *c.Prefill
	}
	if c.SchemaWithTools != nil {
		caps.SchemaWithTools = *c.SchemaWithTools
	}
	if c.SignedCalls != nil {
		caps.SignedCalls = *c.SignedCalls
	}
	if c.MaxStopSequences != nil {
		caps.MaxStopSequences = c.MaxStopSequences
	}
	if c.MaxTemperature != nil {
		caps.MaxTemperature = c.MaxTemperature
	}
	return caps
}

func parseThinking(s string) (llm.Thinking, bool) {
	i := slices.IndexFunc(llm.Thinkings, func(t llm.Thinking) bool { return t.String() == s })
	return llm.Thinkings[max(i, 0)], i >= 0 || s == ""
}

func parseSampling(s string) (llm.Sampling, bool) {
	i := slices.IndexFunc(llm.Samplings, func(v llm.Sampling) bool { return v.String() == s })
	return llm.Samplings[max(i, 0)], i >= 0 || s == ""
}

// oneOf writes the names of values as "a, b or c".
func oneOf[T fmt.Stringer](values []T) string {
	names := make([]string, len(values))
	for i, v := range values {
		names[i] = v.String()
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// capabilities returns what m takes: its provider's table for its id,
// with its configuration over it.
func (m *Model) capabilities() llm.Capabilities {
	var caps llm.Capabilities
	if p, ok := m.Provider.(Capable); ok {
		caps = p.Capabilities(m.ID)
	}
	return m.Capabilities.apply(caps)
}

// sampling returns the temperature and top_p of a call to m with caps:
// the request's, else m's default top_p, which a request's temperature
// displaces on a model that takes one of the two.
func (mc *modelCalls) sampling(m *Model, caps llm.Capabilities) (temperature, topP *float64) {
	temperature, topP = mc.t.req.Temperature, cmp.Or(mc.t.req.TopP, m.TopP)
	if mc.t.req.TopP == nil && temperature != nil && caps.TemperatureOrTopP {
		topP = nil
	}
	return temperature, topP
}

// optionProblems lists what of req's generation options m, a deployment
// of a model, cannot take, each a [FieldError] naming the field and the
// model's limit (and the key that sets it). Options the model is not sent
// (the sampling options of a model that takes none) are not checked.
func optionProblems(m *Model, req *TurnRequest) []error {
	caps := m.capabilities()
	var errs []error
	where := fmt.Sprintf("model %q", m.Alias)
	if m.routed() {
		where = fmt.Sprintf("model %q (deployment %q)", m.Alias, m.Deployment)
	}
	key := fmt.Sprintf("models.%s.capabilities", m.Alias)
	if n := caps.MaxStopSequences; n != nil && len(req.StopSequences) > *n {
		msg := fmt.Sprintf("%s takes at most %d stop sequences, got %d (%s.max_stop_sequences)", where, *n, len(req.StopSequences), key)
		if *n == 0 {
			msg = fmt.Sprintf("%s takes no stop sequences (%s.max_stop_sequences)", where, key)
		}
		errs = append(errs, &FieldError{Field: "generation.stop_sequences", Description: msg})
	}
	reasons := (req.Reasoning != nil || m.Reasoning != nil) && caps.Thinking != llm.ThinkingNone
	if !caps.SendsSampling(reasons) {
		return errs
	}
	if mt, tp := caps.MaxTemperature, req.Temperature; mt != nil && tp != nil && *tp > *mt {
		errs = append(errs, &FieldError{Field: "generation.temperature",
			Description: fmt.Sprintf("%s takes a temperature from 0 to %g, got %g (%s.max_temperature)", where, *mt, *tp, key)})
	}
	if caps.TemperatureOrTopP && req.Temperature != nil && req.TopP != nil {
		errs = append(errs, &FieldError{Field: "generation.top_p",
			Description: fmt.Sprintf("%s takes temperature or top_p, not both (%s.temperature_or_top_p)", where, key)})
	}
	return errs
}

// takesOptions reports whether m, a deployment of a model, can take req's
// generation options.
func takesOptions(m *Model, req *TurnRequest) bool { return len(optionProblems(m, req)) == 0 }

// signaturesFor returns msgs as a model whose signer is signer takes them
// ([llm.Capabilities].Signer): without the thinking parts another API
// signed, which it would refuse (a turn that fell back from Claude to
// Gemini, a conversation that moved between them). A part of no known
// signer is kept, as is every part for a model of none. msgs is returned
// as is, without a copy, when nothing is left out.
func signaturesFor(signer string, msgs []llm.Message) []llm.Message {
	foreign := func(p llm.Part) bool {
		return p.Kind == llm.PartThinking && p.Signer != "" && p.Signer != signer
	}
	if signer == "" {
		return msgs
	}
	var out []llm.Message
	for i, m := range msgs {
		if !slices.ContainsFunc(m.Parts, foreign) {
			continue
		}
		if out == nil {
			out = slices.Clone(msgs)
		}
		out[i].Parts = slices.DeleteFunc(slices.Clone(m.Parts), foreign)
	}
	if out == nil {
		return msgs
	}
	return out
}
