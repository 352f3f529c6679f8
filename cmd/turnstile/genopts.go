package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// genFlags are the flags of turnstile run that set the request's
// generation options and metadata.
type genFlags struct {
	schema     *string
	toolChoice *string
	reasoning  *string
	meta       metaFlag
}

// metaFlag collects --meta KEY=VALUE flags.
type metaFlag map[string]string

func (m metaFlag) String() string { return "" }

func (m metaFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	m[k] = v
	return nil
}

// addGenFlags defines the generation flags on fs.
func addGenFlags(fs *flag.FlagSet) *genFlags {
	g := &genFlags{meta: metaFlag{}}
	g.schema = fs.String("schema", "", "ask for a reply that is one JSON value matching the JSON Schema in this `file` (strict where the provider allows); the server validates it")
	g.toolChoice = fs.String("tool-choice", "", "`mode` of tool calls: auto, none, required, or the name of the tool to call")
	g.reasoning = fs.String("reasoning", "", "reasoning `effort`: low, medium or high (default: the model's)")
	fs.Var(g.meta, "meta", "metadata `KEY=VALUE` of the turn, repeatable (end_user=ID is sent to the provider as the end user)")
	return g
}

var schemaNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// apply sets what the flags ask on req. It fails on a flag value the
// command can tell is wrong before asking the server.
func (g *genFlags) apply(req *turnstilev1.RunTurnRequest) error {
	gen := &turnstilev1.GenerationOptions{}
	if path := *g.schema; path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("--schema: %w", err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m == nil {
			return fmt.Errorf("--schema: %s is not a JSON object", path)
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			return fmt.Errorf("--schema: %w", err)
		}
		name := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		if !schemaNameRE.MatchString(name) {
			name = "" // the server's default
		}
		gen.OutputSchema = &turnstilev1.OutputSchema{Name: name, Schema: s, Strict: true}
	}
	switch c := *g.toolChoice; c {
	case "":
	case "auto":
		gen.ToolChoice = &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO}
	case "none":
		gen.ToolChoice = &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE}
	case "required":
		gen.ToolChoice = &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED}
	default:
		gen.ToolChoice = &turnstilev1.ToolChoice{Mode: turnstilev1.ToolChoiceMode_TOOL_CHOICE_MODE_TOOL, ToolName: c}
	}
	switch r := *g.reasoning; r {
	case "":
	case "low", "medium", "high":
		e := turnstilev1.ReasoningEffort(turnstilev1.ReasoningEffort_value["REASONING_EFFORT_"+strings.ToUpper(r)])
		gen.Reasoning = &turnstilev1.Reasoning{Effort: e}
	default:
		return fmt.Errorf("--reasoning: %q is not low, medium or high", r)
	}
	if gen.OutputSchema != nil || gen.ToolChoice != nil || gen.Reasoning != nil {
		req.Generation = gen
	}
	if len(g.meta) > 0 {
		req.Metadata = g.meta
	}
	return nil
}
