package llm

// Capabilities says what one model can take: how it reasons, when it takes
// sampling options, whether it continues a reply from a trailing assistant
// message, whether it takes an output schema beside tools, the limits of
// its options, and whose thinking signatures it reads. Each adapter keeps
// a table of them by model family; the runtime checks a request against
// its model's before the call, and an adapter builds the request by them.
//
// The zero value knows nothing of the model: every option is sent as
// asked, nothing is checked, and a reply cut short is continued with a
// continuation prompt rather than a prefill, which every model takes.
type Capabilities struct {
	// Thinking is how the model takes a request's reasoning.
	Thinking Thinking
	// Sampling says when the model takes temperature and top_p.
	Sampling Sampling
	// TemperatureOrTopP reports that the model takes temperature or top_p
	// but refuses both in one request.
	TemperatureOrTopP bool
	// Prefill reports that the model continues a conversation that ends
	// with an assistant message from where its text ends (assistant
	// prefill); false: a cut reply is followed by a continuation prompt.
	Prefill bool
	// SchemaWithTools reports that the model takes an output schema in a
	// request that offers tools; false: the adapter asks for the schema
	// another way when tools are offered (see each adapter).
	SchemaWithTools bool
	// MaxStopSequences is the most stop sequences the model takes; nil
	// when no limit is known, 0 when it takes none.
	MaxStopSequences *int
	// MaxTemperature is the highest temperature the model takes (from 0);
	// nil when no limit is known.
	MaxTemperature *float64
	// SignedCalls reports that the model refuses a conversation in which a
	// function call of the current turn (the model steps since the last
	// user message) carries no thought signature (Gemini 3): a call
	// without one, made by another model before a fallback or carrying
	// another API's signature, is sent with the placeholder the API
	// documents for calls it did not make.
	SignedCalls bool
	// Signer names the API whose thinking signatures the model makes and
	// reads ("anthropic", "gemini"); a model is sent only the signatures of
	// its own signer ([Part].Signer). Empty: it makes none, and is sent
	// every signature.
	Signer string
}

// SendsSampling reports whether a call to a model of c sends temperature
// and top_p, when it reasons (reasoning) or not.
func (c Capabilities) SendsSampling(reasoning bool) bool {
	switch c.Sampling {
	case SamplingNever:
		return false
	case SamplingUnlessReasoning:
		return !reasoning
	}
	return true
}

// Thinking is how a model takes a request's reasoning.
type Thinking uint8

// The kinds of [Thinking].
const (
	// ThinkingDefault is the adapter's usual way: a token budget
	// (Anthropic, Gemini) or an effort (OpenAI's reasoning_effort).
	ThinkingDefault Thinking = iota
	// ThinkingBudget is a token budget: Anthropic's thinking {type:
	// enabled, budget_tokens}, Gemini's thinkingBudget.
	ThinkingBudget
	// ThinkingAdaptive is the model deciding how much to reason, at an
	// effort: Anthropic's thinking {type: adaptive} with
	// output_config.effort.
	ThinkingAdaptive
	// ThinkingNone is a model that does not reason: a request's reasoning
	// is not sent to it.
	ThinkingNone
)

// Thinkings lists every [Thinking], in order.
var Thinkings = []Thinking{ThinkingDefault, ThinkingBudget, ThinkingAdaptive, ThinkingNone}

// String returns the kind's name as the configuration writes it:
// default, budget, adaptive or none.
func (t Thinking) String() string {
	switch t {
	case ThinkingBudget:
		return "budget"
	case ThinkingAdaptive:
		return "adaptive"
	case ThinkingNone:
		return "none"
	}
	return "default"
}

// Sampling says when a model takes temperature and top_p.
type Sampling uint8

// The kinds of [Sampling].
const (
	// SamplingAlways sends them as asked.
	SamplingAlways Sampling = iota
	// SamplingUnlessReasoning is a model that refuses them on a call that
	// reasons: such a call goes without them.
	SamplingUnlessReasoning
	// SamplingNever is a model that refuses them on every call (one that
	// always reasons): they are never sent.
	SamplingNever
)

// Samplings lists every [Sampling], in order.
var Samplings = []Sampling{SamplingAlways, SamplingUnlessReasoning, SamplingNever}

// String returns the kind's name as the configuration writes it:
// always, unless_reasoning or never.
func (s Sampling) String() string {
	switch s {
	case SamplingUnlessReasoning:
		return "unless_reasoning"
	case SamplingNever:
		return "never"
	}
	return "always"
}
