package llm_test

import (
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/llm"
)

// TestSendsSampling: which calls send temperature and top_p.
func TestSendsSampling(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s                  llm.Sampling
		plain, whileReason bool
	}{
		{llm.SamplingAlways, true, true},
		{llm.SamplingUnlessReasoning, true, false},
		{llm.SamplingNever, false, false},
	} {
		c := llm.Capabilities{Sampling: tc.s}
		if c.SendsSampling(false) != tc.plain || c.SendsSampling(true) != tc.whileReason {
			t.Errorf("%v: sends %v without reasoning, %v with", tc.s, c.SendsSampling(false), c.SendsSampling(true))
		}
	}
}

// TestCapabilityNames: the names the configuration writes.
func TestCapabilityNames(t *testing.T) {
	t.Parallel()
	var got []string
	for _, v := range llm.Thinkings {
		got = append(got, v.String())
	}
	for _, v := range llm.Samplings {
		got = append(got, v.String())
	}
	want := "default budget adaptive none always unless_reasoning never"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("names %q, want %q", s, want)
	}
}
