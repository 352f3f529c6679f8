package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrInvalidDirective is wrapped by every error about a malformed directive,
// from [New] for Config.Script and in the Err of the [llm.Error] a call
// fails with for a malformed prompt directive.
var ErrInvalidDirective = errors.New("invalid simulator directive")

// The actions a directive can take. Each directive has exactly one.
const (
	actFail      = "fail"
	actTool      = "tool"
	actThink     = "think"
	actRefuse    = "refuse"
	actReply     = "reply"
	actMaxTokens = "max_tokens"
	actDelay     = "delay"
)

// actionOptions lists, per action, the options it accepts besides itself.
var actionOptions = map[string][]string{
	actFail:      {"times", "model", "after", "retry_after", "above", "delay", "message"},
	actTool:      {"args", "step", "model", "delay"},
	actThink:     {"model", "delay"},
	actRefuse:    {"model", "delay"},
	actReply:     {"model", "delay"},
	actMaxTokens: {"model"},
	actDelay:     {"model"},
}

// flagKeys are the keys that may be written without a value.
var flagKeys = []string{actThink, actRefuse}

// directive is one parsed "[sim ...]" group.
type directive struct {
	raw    string   // the directive as written, for messages
	action string   // one of the act* constants
	models []string // provider model ids it is limited to; empty: all

	delay time.Duration // wait before the first chunk

	// fail
	class         string
	times         int // 0: every call
	after         int // paced chunks streamed before the failure
	retryAfter    time.Duration
	hasRetryAfter bool
	above         int // only when the request text exceeds this many bytes; 0: always
	message       string

	// tool
	tool string
	args string // compact JSON object
	step int    // model step of the turn the call belongs to, from 1

	// think, refuse, reply: the text; hasText tells "think" from "think=..."
	text    string
	hasText bool

	// max_tokens
	maxTokens int
}

// appliesTo reports whether d is limited to none or to model.
func (d *directive) appliesTo(model string) bool {
	return len(d.models) == 0 || slices.Contains(d.models, model)
}

// parseScript parses one Config.Script entry: either one or more bracketed
// directives, or the inside of a single directive without its brackets.
func parseScript(entry string) ([]directive, error) {
	s := strings.TrimSpace(entry)
	if s == "" {
		return nil, fmt.Errorf("%w: empty script entry", ErrInvalidDirective)
	}
	if !strings.HasPrefix(s, "[") {
		s = "[sim " + s + "]"
	}
	ds, rest, err := parseText(s)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(rest) != "" {
		return nil, fmt.Errorf("%w: script entry %q holds text outside directives", ErrInvalidDirective, entry)
	}
	return ds, nil
}

// parseText finds the directives in s. It returns them in order of
// appearance and s with them removed. A bracket that opens with "[sim"
// followed by a space or "]" is a directive; other brackets are plain text.
func parseText(s string) ([]directive, string, error) {
	var (
		ds   []directive
		text strings.Builder
		pos  int
	)
	for {
		i := indexOpener(s, pos)
		if i < 0 {
			text.WriteString(s[pos:])
			return ds, text.String(), nil
		}
		text.WriteString(s[pos:i])
		d, end, err := parseDirective(s, i)
		if err != nil {
			return nil, "", err
		}
		ds = append(ds, d)
		text.WriteByte(' ')
		pos = end
	}
}

// indexOpener returns the index of the next "[sim" at or after pos that is
// followed by whitespace or "]", or -1.
func indexOpener(s string, pos int) int {
	for {
		i := strings.Index(s[pos:], "[sim")
		if i < 0 {
			return -1
		}
		i += pos
		j := i + len("[sim")
		if j < len(s) && (isSpace(s[j]) || s[j] == ']') {
			return i
		}
		pos = j
	}
}

// option is one key[=value] of a directive, as written.
type option struct {
	key, val string
	hasVal   bool
}

// parseDirective parses the directive opening at s[start] and returns it with
// the index just past its closing bracket.
func parseDirective(s string, start int) (directive, int, error) {
	opts, end, err := scanDirective(s, start)
	if err != nil {
		return directive{}, 0, err
	}
	d, err := buildDirective(s[start:end], opts)
	if err != nil {
		return directive{}, 0, fmt.Errorf("%w %q: %w", ErrInvalidDirective, clip(s[start:end], 120), err)
	}
	return d, end, nil
}

// scanDirective splits the directive opening at s[start] into its options
// and returns the index just past its closing bracket.
func scanDirective(s string, start int) ([]option, int, error) {
	// bad reports a syntax error, quoting the directive up to the next "]"
	// (or the end of the text) and at least up to where the error is.
	bad := func(end int, format string, args ...any) ([]option, int, error) {
		if j := strings.IndexByte(s[start:], ']'); j >= 0 {
			end = max(end, start+j+1)
		}
		raw := clip(s[start:min(end, len(s))], 120)
		return nil, 0, fmt.Errorf("%w %q: %s", ErrInvalidDirective, raw, fmt.Sprintf(format, args...))
	}
	var opts []option
	i := start + len("[sim")
	for {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i >= len(s) {
			return bad(len(s), "no closing \"]\"")
		}
		if s[i] == ']' {
			return opts, i + 1, nil
		}
		k := i
		for i < len(s) && isKeyByte(s[i]) {
			i++
		}
		if k == i {
			return bad(i+1, "unexpected %q where an option name should be", runeAt(s, i))
		}
		opt := option{key: s[k:i]}
		if i < len(s) && s[i] == '=' {
			i++
			v := i
			if i < len(s) && (s[i] == '"' || s[i] == '{' || s[i] == '[') {
				n, ok := scanJSON(s[i:])
				if !ok {
					return bad(i+1, "option %s: unterminated or mismatched JSON value", opt.key)
				}
				i += n
			} else {
				for i < len(s) && !isSpace(s[i]) && s[i] != ']' {
					i++
				}
			}
			if v == i {
				return bad(i+1, "option %s has an empty value", opt.key)
			}
			opt.val, opt.hasVal = s[v:i], true
		}
		if i < len(s) && !isSpace(s[i]) && s[i] != ']' {
			return bad(i+1, "unexpected %q after option %s", runeAt(s, i), opt.key)
		}
		opts = append(opts, opt)
	}
}

// buildDirective checks the options of the directive raw and applies them.
func buildDirective(raw string, opts []option) (directive, error) {
	d := directive{raw: raw}
	seen := map[string]bool{}
	for _, o := range opts {
		if seen[o.key] {
			return d, fmt.Errorf("option %s given twice", o.key)
		}
		seen[o.key] = true
		if _, ok := actionOptions[o.key]; ok && o.key != actDelay {
			if d.action != "" {
				return d, fmt.Errorf("has two actions, %s and %s; write two directives", d.action, o.key)
			}
			d.action = o.key
		}
	}
	if d.action == "" {
		if !seen[actDelay] {
			return d, errors.New("names no action (one of fail, tool, think, refuse, reply, max_tokens, delay)")
		}
		d.action = actDelay
	}
	allowed := actionOptions[d.action]
	for _, o := range opts {
		if o.key != d.action && !slices.Contains(allowed, o.key) {
			if _, known := actionOptions[o.key]; !known && !isOptionKey(o.key) {
				return d, fmt.Errorf("unknown option %s", o.key)
			}
			return d, fmt.Errorf("option %s does not apply to %s", o.key, d.action)
		}
		if !o.hasVal && !slices.Contains(flagKeys, o.key) {
			return d, fmt.Errorf("option %s needs a value (%s=...)", o.key, o.key)
		}
		if err := d.set(o.key, o.val, o.hasVal); err != nil {
			return d, err
		}
	}
	return d, nil
}

// set applies one option to d.
func (d *directive) set(key, val string, hasVal bool) error {
	var err error
	switch key {
	case actFail:
		c, ok := lookupClass(val)
		if !ok {
			return fmt.Errorf("unknown failure class %q (want one of %s)", val, strings.Join(classNames(), ", "))
		}
		d.class = c
	case actTool:
		if !validToolName(val) {
			return fmt.Errorf("tool name %q must be 1 to 64 letters, digits or _ - . :", val)
		}
		d.tool = val
	case "args":
		var buf bytes.Buffer
		if !strings.HasPrefix(val, "{") || json.Compact(&buf, []byte(val)) != nil {
			return fmt.Errorf("args must be a JSON object, got %s", val)
		}
		d.args = buf.String()
	case actThink, actRefuse, actReply, "message":
		var t string
		if hasVal {
			if t, err = textValue(val); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
		if key == "message" {
			d.message = t
		} else {
			d.text, d.hasText = t, hasVal
		}
	case actMaxTokens:
		d.maxTokens, err = intValue(val, 1)
	case "times":
		d.times, err = intValue(val, 1)
	case "after":
		d.after, err = intValue(val, 0)
	case "above":
		d.above, err = intValue(val, 0)
	case "step":
		d.step, err = intValue(val, 1)
	case actDelay:
		d.delay, err = durationValue(val)
	case "retry_after":
		d.retryAfter, err = durationValue(val)
		d.hasRetryAfter = true
	case "model":
		for m := range strings.SplitSeq(val, ",") {
			if m == "" {
				return fmt.Errorf("model list %q has an empty entry", val)
			}
			d.models = append(d.models, m)
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

// isOptionKey reports whether key is an option of some action.
func isOptionKey(key string) bool {
	for _, opts := range actionOptions {
		if slices.Contains(opts, key) {
			return true
		}
	}
	return false
}

// textValue decodes a JSON string value, or returns a bare value as is.
func textValue(val string) (string, error) {
	if !strings.HasPrefix(val, `"`) {
		if val[0] == '{' || val[0] == '[' {
			return "", fmt.Errorf("want text or a JSON string, got %s", val)
		}
		return val, nil
	}
	var t string
	if err := json.Unmarshal([]byte(val), &t); err != nil {
		return "", fmt.Errorf("bad JSON string %s", val)
	}
	return t, nil
}

// intValue parses a decimal integer of at least lo.
func intValue(val string, lo int) (int, error) {
	n, err := strconv.Atoi(val)
	if err != nil || n < lo {
		return 0, fmt.Errorf("want an integer of at least %d, got %q", lo, val)
	}
	return n, nil
}

// durationValue parses a Go duration ("1.5s", "200ms") or whole seconds ("2").
func durationValue(val string) (time.Duration, error) {
	if n, err := strconv.Atoi(val); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(val)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want a duration such as 500ms or 2s, got %q", val)
	}
	return d, nil
}

// scanJSON returns the length of the JSON string, object or array that s
// starts with, matching brackets outside strings and skipping escapes. It
// reports false for a value that is not closed or whose brackets do not
// match; it does not otherwise validate.
func scanJSON(s string) (int, bool) {
	var open []byte // the closers expected, innermost last
	inStr := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inStr {
			switch c {
			case '\\':
				i++
			case '"':
				inStr = false
				if len(open) == 0 {
					return i + 1, true
				}
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{':
			open = append(open, '}')
		case '[':
			open = append(open, ']')
		case '}', ']':
			if len(open) == 0 || open[len(open)-1] != c {
				return 0, false
			}
			open = open[:len(open)-1]
			if len(open) == 0 {
				return i + 1, true
			}
		}
	}
	return 0, false
}

// runeAt returns the rune at s[i], for messages.
func runeAt(s string, i int) rune {
	r, _ := utf8.DecodeRuneInString(s[i:])
	return r
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isKeyByte(c byte) bool { return c >= 'a' && c <= 'z' || c == '_' }

func validToolName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '-' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}
