package config

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Line is the line of the file the problem is on; 0 when there is none,
	// such as for a section missing from the file altogether.
	Line int
	// Path is the YAML path of the key, such as models.fast.retry.jitter;
	// empty for the file as a whole.
	Path string
	// Message says what is wrong. It never quotes a secret.
	Message string
}

// Errors is every problem found in one configuration, sorted by line then
// path, each once. Its Error method prints one problem per line, as
// "config.yaml:12: models.fast.fallback: unknown key; did you mean
// fallbacks?".
type Errors struct {
	// File is the file's name as given to [Load] or [Parse].
	File string
	// Problems lists the problems in the order they are printed.
	Problems []Problem
}

// Error returns the problems, one per line, without a final newline.
func (e *Errors) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		loc := e.File
		if p.Line > 0 {
			if loc != "" {
				loc += ":"
			}
			loc += strconv.Itoa(p.Line)
		}
		if loc != "" {
			b.WriteString(loc + ": ")
		}
		if p.Path != "" {
			b.WriteString(p.Path)
			b.WriteString(": ")
		}
		b.WriteString(p.Message)
	}
	return b.String()
}

// newErrors returns the problems sorted and without repeats as an
// *Errors, or nil when there are none.
func newErrors(file string, ps []Problem) error {
	if len(ps) == 0 {
		return nil
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Path, b.Path), cmp.Compare(a.Message, b.Message))
	})
	return &Errors{File: file, Problems: slices.Compact(ps)}
}

// suggest returns the candidate closest to word when it is close enough to
// be a likely typo, such as fallbacks for fallback, api_key_env for
// api_key or openai for opnai; "" when none is.
func suggest(word string, candidates []string) string {
	best, bestDist := "", 0
	w := strings.ToLower(word)
	for _, c := range candidates {
		lc := strings.ToLower(c)
		d := distance(w, lc)
		close := d <= max(1, len(lc)/3) && 2*d < len(lc) ||
			len(w) >= 3 && (strings.HasPrefix(lc, w) || strings.HasPrefix(w, lc))
		if close && (best == "" || d < bestDist) {
			best, bestDist = c, d
		}
	}
	return best
}

// distance is the edit distance between a and b, counting bytes: the
// insertions, deletions, substitutions and swaps of two neighbours that
// turn a into b.
func distance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// didYouMean returns "; did you mean X?" for the candidate closest to
// word, or "" when none is close.
func didYouMean(word string, candidates []string) string {
	if s := suggest(word, candidates); s != "" {
		return "; did you mean " + s + "?"
	}
	return ""
}

// list joins names with commas, for messages.
func list(names []string) string { return strings.Join(names, ", ") }

// plural returns one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
