package runtime

import (
	"strings"
	"testing"
)

// TestTextBuf: a reply's text written in pieces of every size comes back
// whole, in order, as a string of its own length, and its blocks never
// hold much more than the text.
func TestTextBuf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		pieces []string
	}{
		{"one word", []string{"hi"}},
		{"words", strings.SplitAfter(strings.Repeat("lorem ", 20000), " ")},
		{"pieces larger than a block", []string{strings.Repeat("a", 100<<10), "b", strings.Repeat("c", 200<<10)}},
		{"multibyte", strings.SplitAfter(strings.Repeat("é€ ", 3000), " ")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b textBuf
			for _, p := range tc.pieces {
				b.write(p)
			}
			want := strings.Join(tc.pieces, "")
			got := b.String()
			if got != want {
				t.Fatalf("String() = %d bytes, want the %d written (first difference at %d)", len(got), len(want), diffAt(got, want))
			}
			held := 0
			for _, blk := range b.blocks {
				held += cap(blk)
			}
			// The last block is at most the text before it, capped.
			if limit := len(want) + max(textBlockMin, min(len(want), textBlockMax)); held > limit {
				t.Errorf("blocks hold %d bytes for %d of text, want at most %d", held, len(want), limit)
			}
		})
	}
}

func diffAt(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
