package runtime

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/turnstile-dev/turnstile/llm"
)

// MetadataEndUser is the key of [TurnRequest.Metadata] whose value is sent
// to the provider as the end user's id.
const MetadataEndUser = "end_user"

// OutputSchemas compiles the JSON Schemas of requests' output schemas.
// Compile fails when schema is not a valid JSON Schema, with a message fit
// for the client that does not quote the schema; the check it returns
// lists what in text does not match, none when it matches, and is safe for
// concurrent use.
type OutputSchemas interface {
	Compile(schema []byte) (check func(text string) []string, err error)
}

// maxOutputIssues bounds how many validation errors a correction message
// and an OUTPUT_INVALID error list.
const maxOutputIssues = 8

// validateOptions checks what the runner's configuration decides of the
// request's generation options: that an output schema compiles and that a
// tool to call is offered on the turn's first model.
func (r *Runner) validateOptions(req *TurnRequest) []error {
	var errs []error
	if s := req.OutputSchema; s != nil {
		switch {
		case r.opts.schemas == nil:
			errs = append(errs, &FieldError{Field: "generation.output_schema", Description: "this server does not validate output schemas"})
		default:
			if _, err := r.opts.schemas.Compile(s.Schema); err != nil {
				errs = append(errs, &FieldError{Field: "generation.output_schema.schema", Description: clipText(err.Error(), 300)})
			}
		}
	}
	if c := req.ToolChoice; c != nil && c.Mode == llm.ToolChoiceTool {
		alias := req.Model
		if alias == "" {
			alias = r.defaultModel
		}
		offered := slices.ContainsFunc(req.ClientTools, func(s llm.ToolSpec) bool { return s.Name == c.Name })
		if m := r.models[alias]; !offered && m != nil && r.tools[c.Name] != nil && allowed(m, c.Name) {
			offered = true
		}
		if !offered {
			errs = append(errs, &FieldError{
				Field:       "generation.tool_choice.tool_name",
				Description: fmt.Sprintf("%.64q is not a tool the turn offers (its client tools and the server's tools of model %q)", c.Name, alias),
			})
		}
	}
	return errs
}

// clipText cuts s to at most n bytes, on a rune boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// reasoning returns the reasoning asked of a call to m: the request's, else
// the model's default.
func (mc *modelCalls) reasoning(m *Model) *llm.Reasoning {
	if mc.t.req.Reasoning != nil {
		return mc.t.req.Reasoning
	}
	return m.Reasoning
}

// toolChoice returns the tool choice of a call to m: the request's, but
// not a tool m is not offered.
func (mc *modelCalls) toolChoice(m *Model, tools []llm.ToolSpec) *llm.ToolChoice {
	c := mc.t.req.ToolChoice
	if c != nil && c.Mode == llm.ToolChoiceTool &&
		!slices.ContainsFunc(tools, func(s llm.ToolSpec) bool { return s.Name == c.Name }) {
		return nil
	}
	return c
}

// checkOutput validates a reply that ends the turn, msg with stop (and
// the start of it being continued, mc.t.reply), against the request's output
// schema. It returns nil when there is no schema, when the reply calls
// tools (the schema is the final answer's), when it does not end the turn
// with an answer (cut by the output limit: it is continued, or ends the
// turn MAX_TOKENS; paused; refused), or when its text matches. Otherwise
// it returns the OUTPUT_INVALID failure, whose message lists the first
// validation errors, and the errors.
func (t *turn) checkOutput(msg llm.Message, stop llm.StopReason) (*llm.Error, []string) {
	s := t.req.OutputSchema
	if s == nil || slices.ContainsFunc(msg.Parts, func(p llm.Part) bool { return p.Kind == llm.PartToolCall }) {
		return nil, nil
	}
	switch stop {
	case llm.StopMaxTokens, llm.StopPauseTurn, llm.StopRefusal:
		return nil, nil
	}
	msg = llm.Message{Parts: mergeParts(t.reply, msg.Parts)}
	if t.outputCheck == nil {
		if t.r.opts.schemas == nil {
			return &llm.Error{Kind: llm.KindInvalidRequest, Message: "this server does not validate output schemas"}, nil
		}
		check, err := t.r.opts.schemas.Compile(s.Schema) // validated before: does not fail
		if err != nil {
			return &llm.Error{Kind: llm.KindInvalidRequest, Message: "the output schema does not compile", Err: err}, nil
		}
		t.outputCheck = check
	}
	issues := t.outputCheck(replyText(msg))
	if len(issues) == 0 {
		return nil, nil
	}
	return &llm.Error{Kind: llm.KindOutputInvalid, Message: "the reply does not match the output schema: " + listIssues(issues, "; ")}, issues
}

// listIssues joins the first maxOutputIssues issues with sep.
func listIssues(issues []string, sep string) string {
	if len(issues) > maxOutputIssues {
		more := fmt.Sprintf("and %d more", len(issues)-maxOutputIssues)
		issues = append(issues[:maxOutputIssues:maxOutputIssues], more)
	}
	return strings.Join(issues, sep)
}

// replyText is the text of a reply, its thinking left out.
func replyText(msg llm.Message) string {
	var b strings.Builder
	for _, p := range msg.Parts {
		if p.Kind == llm.PartText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// correct sets what the next call of the step is shown after the reply
// msg failed validation with issues: the reply, then a user message
// listing them. Neither is committed: the client's conversation never
// holds them.
func (t *turn) correct(msg llm.Message, issues []string) {
	note := "Your reply does not match the required JSON Schema:\n- " + listIssues(issues, "\n- ") +
		"\nReply again with only a JSON value that matches the schema."
	t.correction = []llm.Message{
		{Role: llm.RoleAssistant, Parts: []llm.Part{{Kind: llm.PartText, Text: replyText(msg)}}},
		{Role: llm.RoleUser, Parts: []llm.Part{{Kind: llm.PartText, Text: note}}},
	}
	t.corrections++
}
