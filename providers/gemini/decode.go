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
	provider   string
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
			stop, failed := finishReason(c.FinishReason, d.toolCalls > 0)
			if failed {
				msg := c.FinishMessage
				if msg == "" {
					msg = "the model produced an invalid function call"
				}
				return false, &llm.Error{
					Kind:     llm.KindServerError,
					Message:  fmt.Sprintf("%s (%s)", msg, c.FinishReason),
					Provider: d.provider,
					Err:      fmt.Errorf("finishReason %s", c.FinishReason),
				}
			}
			d.stop = stop
		}
	}
	if fb := resp.PromptFeedback; fb != nil && fb.BlockReason != "" && fb.BlockReason != genai.BlockedReasonUnspecified {
		d.finished, d.stop = true, llm.StopRefusal
	}
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
		index := d.toolCalls
		d.toolCalls++
		id := fc.ID
		if id == "" {
			// The Gemini API often sends no id; results are matched by
			// this one, which is unique within the reply.
			id = fmt.Sprintf("call_%d_%s", index, fc.Name)
		}
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

// signature yields a thought signature that belongs to the part after it
// as a thinking block of its own with no text.
func (d *decoder) signature(sig string, emit func(llm.Chunk) bool) bool {
	d.thinking++
	return emit(llm.Chunk{Kind: llm.ChunkThinking, Index: d.thinking - 1, Signature: sig})
}

// finishReason maps a finishReason; failed reports a finish that makes the
// reply unusable (a malformed or unexpected function call).
func finishReason(r genai.FinishReason, calls bool) (stop llm.StopReason, failed bool) {
	switch r {
	case genai.FinishReasonStop:
		if calls {
			return llm.StopToolUse, false
		}
		return llm.StopEndTurn, false
	case genai.FinishReasonMaxTokens:
		return llm.StopMaxTokens, false
	case genai.FinishReasonSafety, genai.FinishReasonProhibitedContent, genai.FinishReasonBlocklist,
		genai.FinishReasonSPII, genai.FinishReasonRecitation, genai.FinishReasonImageSafety,
		genai.FinishReasonImageProhibitedContent, genai.FinishReasonImageRecitation:
		return llm.StopRefusal, false
	case genai.FinishReasonMalformedFunctionCall, genai.FinishReasonUnexpectedToolCall:
		return llm.StopUnspecified, true
	}
	if calls {
		return llm.StopToolUse, false
	}
	return llm.StopUnspecified, false
}
