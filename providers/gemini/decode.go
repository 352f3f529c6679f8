package gemini

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/turnstile-dev/turnstile/llm"
	"google.golang.org/genai"
)

// decoder holds the state of one streamed reply: it is the
// stream.Decoder of a generateContent stream.
type decoder struct {
	provider string
	// answer is the function the call asks its output schema through,
	// whose call is the reply's answer (see [answer]).
	answer     answer
	responseID string
	toolCalls  int
	thinking   int
	// inThought reports that the last part was a thought, so more thought
	// text continues the same block.
	inThought bool
	finished  bool
	stop      llm.StopReason
	// model is the modelVersion the responses named.
	model string
}

// Finish reports the stop reason and whether a finishReason (or a blocked
// prompt) arrived.
func (d *decoder) Finish() (llm.StopReason, bool) { return d.stop, d.finished }

// Model returns the modelVersion the responses named.
func (d *decoder) Model() string { return d.model }

// ResponseID returns the responseId the responses named.
func (d *decoder) ResponseID() string { return d.responseID }

// Decode yields the runtime chunks of one streamed response through emit.
// It returns false when emit did, and an error for a finish that means the
// reply is unusable.
func (d *decoder) Decode(resp *genai.GenerateContentResponse, emit func(llm.Chunk) bool) (bool, *llm.Error) {
	if resp == nil {
		return true, nil
	}
	if resp.ResponseID != "" {
		d.responseID = resp.ResponseID
	}
	if resp.ModelVersion != "" {
		d.model = resp.ModelVersion
	}
	var failed *llm.Error
	if len(resp.Candidates) > 0 && resp.Candidates[0] != nil {
		c := resp.Candidates[0]
		if c.Content != nil {
			for _, part := range c.Content.Parts {
				if part != nil && !d.part(part, emit) {
					return false, nil
				}
			}
		}
		if c.FinishReason != "" && c.FinishReason != genai.FinishReasonUnspecified {
			d.finished = true
			stop, kind, why := finishReason(c.FinishReason, d.toolCalls > 0)
			if why != "" {
				msg := c.FinishMessage
				if msg == "" {
					msg = why
				}
				failed = &llm.Error{
					Kind:     kind,
					Message:  fmt.Sprintf("%s (%s)", msg, c.FinishReason),
					Provider: d.provider,
					Err:      fmt.Errorf("finishReason %s", c.FinishReason),
				}
			} else {
				d.stop = stop
			}
		}
	}
	if fb := resp.PromptFeedback; fb != nil && fb.BlockReason != "" && fb.BlockReason != genai.BlockedReasonUnspecified {
		d.finished, d.stop = true, llm.StopRefusal
	}
	// The usage of the response comes before its failure: a call that
	// ended in a failed finish was still billed for what it read and wrote,
	// and the turn charges what the provider reported, not an estimate.
	if u := resp.UsageMetadata; u != nil {
		usage := llm.Usage{
			InputTokens:     max(int64(u.PromptTokenCount)+int64(u.ToolUsePromptTokenCount)-int64(u.CachedContentTokenCount), 0),
			OutputTokens:    int64(u.CandidatesTokenCount) + int64(u.ThoughtsTokenCount),
			CacheReadTokens: int64(u.CachedContentTokenCount),
		}
		if !emit(llm.Chunk{Kind: llm.ChunkUsage, Usage: usage}) {
			return false, nil
		}
	}
	if failed != nil {
		return false, failed
	}
	return true, nil
}

// part yields one content part.
func (d *decoder) part(p *genai.Part, emit func(llm.Chunk) bool) bool {
	sig := ""
	if len(p.ThoughtSignature) > 0 {
		sig = base64.StdEncoding.EncodeToString(p.ThoughtSignature)
	}
	switch {
	case p.Thought:
		if !d.inThought {
			d.inThought = true
			d.thinking++
		}
		return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: d.thinking - 1, Text: p.Text, Signature: sig})
	case p.FunctionCall != nil:
		d.inThought = false
		if sig != "" && !d.signature(sig, emit) {
			return false
		}
		fc := p.FunctionCall
		if d.answer.function != "" && fc.Name == d.answer.function {
			return emit(llm.Chunk{Kind: llm.ChunkText, Text: d.answerText(fc.Args)})
		}
		index := d.toolCalls
		d.toolCalls++
		// Gemini 2.5 sends no id: the call goes without one, and the
		// runtime gives it an id unique within the conversation.
		id := fc.ID
		args := []byte("{}")
		if len(fc.Args) > 0 {
			b, err := json.Marshal(fc.Args)
			if err == nil {
				args = b
			}
		}
		return emit(llm.Chunk{Kind: llm.ChunkToolCallStart, Index: index, CallID: id, Name: fc.Name}) &&
			emit(llm.Chunk{Kind: llm.ChunkToolCallArgs, Index: index, Text: string(args)}) &&
			emit(llm.Chunk{Kind: llm.ChunkToolCallEnd, Index: index})
	default:
		d.inThought = false
		if sig != "" && !d.signature(sig, emit) {
			return false
		}
		if p.Text != "" {
			return emit(llm.Chunk{Kind: llm.ChunkText, Text: p.Text})
		}
	}
	return true
}

// answerText is the reply's text that the arguments of a call of the
// answer function stand for: the arguments, or their "response" when the
// schema was wrapped, as JSON.
func (d *decoder) answerText(args map[string]any) string {
	var v any = args
	if d.answer.wrapped {
		v = args["response"]
	}
	if v == nil && !d.answer.wrapped {
		v = map[string]any{}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "null"
	}
	return string(b)
}

// signature yields a thought signature that belongs to the part after it
// as a thinking block of its own with no text.
func (d *decoder) signature(sig string, emit func(llm.Chunk) bool) bool {
	d.thinking++
	return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: d.thinking - 1, Signature: sig})
}

// finishReason maps a finishReason to a stop reason, or, with why set, to
// the failure a reply that ended so is: why says what happened when the
// API gave no message.
func finishReason(r genai.FinishReason, calls bool) (stop llm.StopReason, kind llm.Kind, why string) {
	switch r {
	case genai.FinishReasonStop:
		if calls {
			return llm.StopToolUse, 0, ""
		}
		return llm.StopEndTurn, 0, ""
	case genai.FinishReasonMaxTokens, genai.FinishReasonContinuation:
		return llm.StopMaxTokens, 0, ""
	case genai.FinishReasonSafety, genai.FinishReasonProhibitedContent, genai.FinishReasonBlocklist,
		genai.FinishReasonSPII, genai.FinishReasonRecitation, genai.FinishReasonImageSafety,
		genai.FinishReasonImageProhibitedContent, genai.FinishReasonImageRecitation:
		return llm.StopRefusal, 0, ""
	case genai.FinishReasonMalformedFunctionCall, genai.FinishReasonUnexpectedToolCall:
		return llm.StopUnspecified, llm.KindServerError, "the model produced an invalid function call"
	case genai.FinishReasonTooManyToolCalls:
		return llm.StopUnspecified, llm.KindServerError, "the model called too many functions in a row"
	case genai.FinishReasonLanguage:
		return llm.StopUnspecified, llm.KindInvalidRequest, "the model does not answer in the language of the request"
	}
	// OTHER, and any reason this adapter does not know: the reply stopped
	// for a reason that is not a success.
	return llm.StopUnspecified, llm.KindServerError, "the model stopped for a reason the API did not give"
}
