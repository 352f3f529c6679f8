package config

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestHandTableMatchesReference holds the guided table of
// docs/configuration.md to the generated reference: every key the table
// names exists in the decoder (a renamed or removed key fails), and every
// key the decoder knows is in the table (a key added in code must be
// explained there too), so the two cannot drift.
func TestHandTableMatchesReference(t *testing.T) {
	hand := handKeys(t, "../docs/configuration.md")
	gen := referenceKeys(t, "../docs/config-reference.md")
	for _, k := range hand {
		if strings.HasSuffix(k, ".") && slices.ContainsFunc(gen, func(g string) bool { return strings.HasPrefix(g, k) }) {
			continue
		}
		if !slices.Contains(gen, k) && !coveredBy(k, gen) {
			t.Errorf("docs/configuration.md names %q, which the decoder does not know (docs/config-reference.md)", k)
		}
	}
	for _, k := range gen {
		if container(k, gen) {
			continue // a block: its keys have rows of their own
		}
		if !slices.Contains(hand, k) && !coveredBy(k, hand) {
			t.Errorf("the decoder knows %q, which docs/configuration.md's table does not explain", k)
		}
	}
}

var keyCell = regexp.MustCompile("^\\| (`[^|]*`) \\|")

// handKeys returns the keys of the table of page: the first cell's
// backquoted keys, a `.x` after a key standing for its sibling x, with
// NAME and ALIAS as the reference writes map keys.
func handKeys(t *testing.T, page string) []string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		m := keyCell.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var prefix string
		for _, k := range regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(m[1], -1) {
			key := k[1]
			if strings.HasPrefix(key, ".") && prefix != "" {
				key = prefix + key[1:]
			} else if i := strings.LastIndex(key, "."); i >= 0 {
				prefix = key[:i+1]
			}
			key = strings.NewReplacer("NAME", "<name>", "ALIAS", "<alias>").Replace(key)
			if b, ok := strings.CutSuffix(key, "..."); ok {
				key = b + "." // a block explained elsewhere: every key below it
			}
			out = append(out, key)
		}
	}
	if len(out) < 50 {
		t.Fatalf("%s: %d keys read from its table; the table's shape changed", page, len(out))
	}
	return out
}

// referenceKeys returns the keys of the generated reference's tables.
func referenceKeys(t *testing.T, page string) []string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		if m := keyCell.FindStringSubmatch(line); m != nil {
			k := strings.Trim(m[1], "`")
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// coveredBy reports whether key is a key below one that keys names as a
// whole block: `mcp_servers.<name>` (its own page) or `models.<alias>.retry`
// (the retry block again).
func coveredBy(key string, keys []string) bool {
	for _, k := range keys {
		if strings.HasSuffix(k, ".") && strings.HasPrefix(key, k) {
			return true
		}
		if (k == "models.<alias>.retry" && strings.HasPrefix(key, "models.<alias>.retry.")) ||
			(key == "models.<alias>.retry" && strings.HasPrefix(k, "models.<alias>.retry.")) {
			return true
		}
	}
	return false
}

// container reports whether key holds other keys of keys (a block or a
// map of blocks).
func container(key string, keys []string) bool {
	return slices.ContainsFunc(keys, func(k string) bool {
		return strings.HasPrefix(k, key+".") || strings.HasPrefix(k, key+"[]")
	})
}
