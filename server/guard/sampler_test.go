package guard

import (
	"fmt"
	"testing"
	"time"
)

// TestSampler: a peer gets sampleBurst lines at once, then sampleRate a
// second; the first line written after a gap says how many were left
// out; peers do not share a budget, and many peers at once share one.
func TestSampler(t *testing.T) {
	s := newSampler()
	t0 := time.Unix(1000, 0)
	for i := range sampleBurst {
		if ok, n := s.allow("a", t0); !ok || n != 0 {
			t.Fatalf("line %d: %v, %d left out", i, ok, n)
		}
	}
	for range 7 {
		if ok, _ := s.allow("a", t0); ok {
			t.Fatal("a line over the burst was written")
		}
	}
	if ok, _ := s.allow("b", t0); !ok {
		t.Error("another peer's line was left out")
	}
	if ok, n := s.allow("a", t0.Add(time.Second)); !ok || n != 7 {
		t.Errorf("a second later: %v, %d left out; want a line saying 7", ok, n)
	}
	for i := range samplerMaxKeys + 10 {
		s.allow(fmt.Sprint("p", i), t0)
	}
	if len(s.peers) > samplerMaxKeys+1 {
		t.Errorf("%d peers remembered", len(s.peers))
	}
}
