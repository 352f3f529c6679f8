package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/turnstile-dev/turnstile/llm"
)

// greeting answers a conversation without a question.
const greeting = "Hello! I am turnstile's built-in simulator. Ask me anything and I will stream a short, deterministic reply."

// defaultRefusal is the text of "refuse" without a value.
const defaultRefusal = "I'm sorry, but I can't help with that request."

// answerTemplates shape the default answer; %s is the question's gist. The
// template is chosen by a hash of the question, so an answer never changes.
var answerTemplates = []string{
	`You asked: "%s". I am turnstile's built-in simulator, so this reply is generated deterministically rather than by a language model. Point turnstile at a real provider to get a real answer.`,
	`Good question about "%s". As the embedded simulator I have no real knowledge, but I can stream a plausible reply token by token. The same question always gets this same answer.`,
	`Let me think about "%s". A real model would reason about it in depth; the simulator only pretends to, which is enough to exercise streaming, retries and fallbacks. Configure OpenAI, Anthropic or Gemini for substantive answers.`,
	`Here is my answer to "%s": it depends on details a simulator cannot know. What I can promise is that this reply is stable, so tests that rely on it stay reproducible.`,
}

// defaultAnswer is the reply to question, whose directives were removed.
func defaultAnswer(question string) string {
	q := strings.Join(strings.Fields(question), " ")
	if q == "" {
		return greeting
	}
	h := fnv.New32a()
	h.Write([]byte(q))
	return fmt.Sprintf(answerTemplates[h.Sum32()%uint32(len(answerTemplates))], gist(q))
}

// maxGistBytes bounds the gist a reply quotes: a prompt of a dozen
// megabyte-long words must not make a reply larger than an event may be.
const maxGistBytes = 200

// gist returns the first dozen words of q without trailing punctuation,
// at most maxGistBytes of them.
func gist(q string) string {
	words := strings.Fields(q)
	cut := len(words) > 12
	if cut {
		words = words[:12]
	}
	g := strings.Join(words, " ")
	if len(g) > maxGistBytes {
		g, cut = clip(g, maxGistBytes), false
	}
	g = strings.TrimRight(g, ".?!,;: ")
	g = strings.ReplaceAll(g, `"`, "'")
	if cut {
		g += "…"
	}
	return g
}

// toolAnswer is the reply once the tools called for question returned
// results.
func toolAnswer(question string, results []llm.ToolResult) string {
	var b strings.Builder
	for _, r := range results {
		name := r.Name
		if name == "" {
			name = r.CallID
		}
		content := clip(strings.Join(strings.Fields(r.Content), " "), 300)
		if r.IsError {
			fmt.Fprintf(&b, "The %s tool failed: %s. ", name, content)
		} else {
			fmt.Fprintf(&b, "The %s tool returned %s. ", name, content)
		}
		if d := describeMedia(r.Media); d != "" {
			b.WriteString(d[1:] + " ")
		}
	}
	if q := strings.Join(strings.Fields(question), " "); q != "" {
		fmt.Fprintf(&b, `That is what I found about "%s".`, gist(q))
	} else {
		b.WriteString("That is what I found.")
	}
	return b.String()
}

// thinkingText is the reasoning of "think" without a value.
func thinkingText(question string) string {
	q := strings.Join(strings.Fields(question), " ")
	if q == "" {
		return "There is no question yet, so I will introduce myself briefly."
	}
	return fmt.Sprintf(`The user asks about "%s". I should answer directly, in a couple of sentences, and say plainly that I am a simulator.`, gist(q))
}

// signature is the deterministic signature of a reasoning block.
func signature(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "simsig_" + hex.EncodeToString(sum[:12])
}

// tokenize splits s into word-ish tokens, each a run of non-space bytes
// followed by the spaces after it, so the tokens concatenate back to s.
func tokenize(s string) []string {
	var toks []string
	for tok, rest := nextToken(s); tok != ""; tok, rest = nextToken(rest) {
		toks = append(toks, tok)
	}
	return toks
}

// nextToken returns the first token of s ([tokenize]) and the rest.
func nextToken(s string) (tok, rest string) {
	j := 0
	for j < len(s) && !isSpace(s[j]) {
		j++
	}
	for j < len(s) && isSpace(s[j]) {
		j++
	}
	return s[:j], s[j:]
}

// fragments splits JSON arguments into at least two pieces (when they have
// two bytes or more) of at most eight bytes, as providers stream them.
func fragments(args string) []string {
	if len(args) < 2 {
		return []string{args}
	}
	size := min(8, (len(args)+1)/2)
	var out []string
	for len(args) > 0 {
		n := min(size, len(args))
		out = append(out, args[:n])
		args = args[n:]
	}
	return out
}

// tokensOf estimates the tokens of size bytes of text: a quarter, at least 1.
func tokensOf(size int) int { return max(1, size/4) }

// clip shortens s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// resumeAt reports where a reply continues when partial, the text already
// produced, is a strict prefix of full, comparing without whitespace. The
// index is past the last matched byte, and past following whitespace when
// partial itself ended in whitespace.
func resumeAt(full, partial string) (int, bool) {
	i, j := 0, 0
	matched := false
	for {
		for j < len(partial) && isSpace(partial[j]) {
			j++
		}
		if j == len(partial) {
			break
		}
		for i < len(full) && isSpace(full[i]) {
			i++
		}
		if i == len(full) || full[i] != partial[j] {
			return 0, false
		}
		i++
		j++
		matched = true
	}
	if !matched || strings.TrimSpace(full[i:]) == "" {
		return 0, false
	}
	if isSpace(partial[len(partial)-1]) {
		for i < len(full) && isSpace(full[i]) {
			i++
		}
	}
	return i, true
}

// maxDescribed bounds the media an answer lists.
const maxDescribed = 8

// describeMedia says what media the simulator received, " I received ..."
// (empty for none): each one's type, size or "by URI", and name. Never
// its bytes, nor its URI, which may carry a token.
func describeMedia(ms []llm.Media) string {
	if len(ms) == 0 {
		return ""
	}
	var b strings.Builder
	noun := "media"
	if len(ms) == 1 {
		noun = "media file"
	}
	fmt.Fprintf(&b, " I received %d %s: ", len(ms), noun)
	for i, m := range ms {
		if i == maxDescribed {
			fmt.Fprintf(&b, "; and %d more", len(ms)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		if m.URI != "" {
			fmt.Fprintf(&b, "%s by URI", m.MIMEType)
		} else {
			fmt.Fprintf(&b, "%s of %d bytes", m.MIMEType, len(m.Data))
		}
		if m.Name != "" {
			fmt.Fprintf(&b, " named '%s'", clip(strings.ReplaceAll(m.Name, `"`, "'"), 64))
		}
	}
	b.WriteString(".")
	return b.String()
}
