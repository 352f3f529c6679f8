package sim

import (
	"strings"
	"testing"
	"time"
)

func TestSettings(t *testing.T) {
	s := DefaultSettings()
	if s.TokenDelay != DefaultTokenDelay || len(s.Problems()) > 0 || s.EnvVars() != nil {
		t.Errorf("defaults = %+v, problems %v", s, s.Problems())
	}
	s.Script = []string{"fail=overloaded times=1", "fail=nope"}
	p := s.Problems()
	if len(p) != 1 || p[0].Field != "script[1]" || !strings.Contains(p[0].Message, "invalid simulator directive") {
		t.Errorf("Problems = %v, want one at script[1]", p)
	}

	for _, tt := range []struct {
		set, want int64
	}{{0, -1}, {-1, -1}, {int64(DefaultTokenDelay), int64(DefaultTokenDelay)}, {5, 5}} {
		s := &Settings{TokenDelay: time.Duration(tt.set)}
		built, err := s.Build("sim", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := built.(*Provider).tokenDelay; int64(got) != tt.want {
			t.Errorf("token_delay %d builds a pause of %d, want %d", tt.set, got, tt.want)
		}
	}
}
