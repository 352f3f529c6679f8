package runtime

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// Tool results are cut to the turn's MaxToolResultBytes, so that no event
// carrying them, nor the conversation the model gets, grows without bound.

// truncated returns content cut to at most n bytes: its beginning, on a
// rune boundary, then a note of how many bytes it had. It reports whether
// it cut anything. For n too small to hold the note, the note alone is
// returned.
func truncated(content string, n int) (string, bool) {
	if len(content) <= n {
		return content, false
	}
	// The note with the widest numbers it may hold, to size the cut.
	widest := truncationNote(len(content), len(content))
	keep := max(0, n-len(widest))
	for keep > 0 && !utf8.RuneStart(content[keep]) {
		keep--
	}
	return content[:keep] + truncationNote(keep, len(content)), true
}

func truncationNote(kept, total int) string {
	return fmt.Sprintf("\n[turnstile: tool result truncated: the first %d of %d bytes are shown]", kept, total)
}

// shareBudget cuts the contents of results so that together they hold at
// most budget bytes: results smaller than an even share keep everything,
// and the larger ones share the rest equally. It returns the indexes of
// the results it cut.
func shareBudget(contents []string, budget int) []int {
	total := 0
	for _, c := range contents {
		total += len(c)
	}
	if total <= budget {
		return nil
	}
	// Find the largest cap such that the results, each cut to it, fit.
	sizes := make([]int, len(contents))
	for i, c := range contents {
		sizes[i] = len(c)
	}
	slices.Sort(sizes)
	limit, left := 0, budget
	for i, s := range sizes {
		share := left / (len(sizes) - i)
		if s > share {
			limit = share
			break
		}
		left -= s
		limit = s
	}
	var cut []int
	for i, c := range contents {
		if len(c) > limit {
			contents[i], _ = truncated(c, limit)
			cut = append(cut, i)
		}
	}
	return cut
}
