package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []directive
		text string
	}{
		{
			in:   "no directives [simple] [x]",
			text: "no directives [simple] [x]",
		},
		{
			in: "[sim fail=overloaded times=2 after=3 model=a,b delay=250ms] hi",
			want: []directive{{
				raw: "[sim fail=overloaded times=2 after=3 model=a,b delay=250ms]", action: actFail,
				class: "overloaded", times: 2, after: 3, models: []string{"a", "b"}, delay: 250 * time.Millisecond,
			}},
			text: "  hi",
		},
		{
			in: "[sim fail=stall] [sim fail=rate_limit retry_after=2]",
			want: []directive{
				{raw: "[sim fail=stall]", action: actFail, class: classTimeout},
				{raw: "[sim fail=rate_limit retry_after=2]", action: actFail, class: "rate_limit", retryAfter: 2 * time.Second, hasRetryAfter: true},
			},
			text: "   ",
		},
		{
			in: `a [sim  tool=get.weather   args={"city": "Oslo ]", "days": [1, 2]} step=2 ] b`,
			want: []directive{{
				raw:    `[sim  tool=get.weather   args={"city": "Oslo ]", "days": [1, 2]} step=2 ]`,
				action: actTool, tool: "get.weather", args: `{"city":"Oslo ]","days":[1,2]}`, step: 2,
			}},
			text: "a   b",
		},
		{
			in: `[sim think]x[sim think="a \"quoted\" thought"][sim refuse=No.]`,
			want: []directive{
				{raw: "[sim think]", action: actThink},
				{raw: `[sim think="a \"quoted\" thought"]`, action: actThink, text: `a "quoted" thought`, hasText: true},
				{raw: "[sim refuse=No.]", action: actRefuse, text: "No.", hasText: true},
			},
			text: " x  ",
		},
		{
			in: "[sim delay=1.5s]\n[sim max_tokens=7 model=m]\t[sim fail=context_overflow above=4000 message=\"too big\"]",
			want: []directive{
				{raw: "[sim delay=1.5s]", action: actDelay, delay: 1500 * time.Millisecond},
				{raw: "[sim max_tokens=7 model=m]", action: actMaxTokens, maxTokens: 7, models: []string{"m"}},
				{raw: `[sim fail=context_overflow above=4000 message="too big"]`, action: actFail, class: "context_overflow", above: 4000, message: "too big"},
			},
			text: " \n \t ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, text, err := parseText(tt.in)
			if err != nil {
				t.Fatalf("parseText(%q) error: %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(directive{})); diff != "" {
				t.Errorf("parseText(%q) directives (-want +got):\n%s", tt.in, diff)
			}
			if text != tt.text {
				t.Errorf("parseText(%q) text = %q, want %q", tt.in, text, tt.text)
			}
		})
	}
}

func TestParseTextErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, fragment string }{
		{"[sim fail=bogus]", `unknown failure class "bogus"`},
		{"[sim fail=overloaded", "no closing"},
		{`[sim tool=x args={"a":1]`, "unterminated or mismatched JSON"},
		{`[sim tool=x args={"a":}]`, "args must be a JSON object"},
		{`[sim tool=x args="s"]`, "args must be a JSON object"},
		{"[sim tool=bad/name]", "tool name"},
		{"[sim fail=overloaded fail=quota]", "given twice"},
		{"[sim fail=overloaded reply=x]", "two actions"},
		{"[sim think step=2]", "does not apply to think"},
		{"[sim fail=overloaded colour=red]", "unknown option colour"},
		{"[sim times=2]", "names no action"},
		{"[sim]", "names no action"},
		{"[sim fail]", "needs a value"},
		{"[sim fail=]", "empty value"},
		{"[sim fail=quota times=-1]", "at least 1"},
		{"[sim fail=quota after=x]", "at least 0"},
		{"[sim delay=-1s]", "duration"},
		{"[sim reply={}]", "want text or a JSON string"},
		{`[sim reply="unterminated]`, "unterminated or mismatched JSON"},
		{"[sim fail=quota model=a,,b]", "empty entry"},
		{`[sim reply="x"y]`, `unexpected 'y'`},
		{"[sim Fail=quota]", "where an option name should be"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			_, _, err := parseText("before " + tt.in + " after")
			if !errors.Is(err, ErrInvalidDirective) {
				t.Fatalf("parseText(%q) error = %v, want ErrInvalidDirective", tt.in, err)
			}
			if !strings.Contains(err.Error(), tt.fragment) {
				t.Errorf("parseText(%q) error = %q, want it to contain %q", tt.in, err, tt.fragment)
			}
		})
	}
}

func TestResumeAt(t *testing.T) {
	t.Parallel()
	const full = "Hello, brave new world."
	tests := []struct {
		partial string
		rest    string
		ok      bool
	}{
		{"Hello, ", "brave new world.", true},
		{"Hello,", " brave new world.", true},
		{"Hello,  brave\nnew ", "world.", true},
		{"Hello, brave new world.", "", false},
		{"Hello, brave new world. ", "", false},
		{"Goodbye", "", false},
		{"   ", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		i, ok := resumeAt(full, tt.partial)
		if ok != tt.ok || ok && full[i:] != tt.rest {
			t.Errorf("resumeAt(%q) = rest %q, %v; want %q, %v", tt.partial, full[i:], ok, tt.rest, tt.ok)
		}
	}
}

func TestFragments(t *testing.T) {
	t.Parallel()
	for _, args := range []string{"{}", `{"a":1}`, `{"zone":"UTC"}`, strings.Repeat("x", 100)} {
		f := fragments(args)
		if len(f) < 2 || strings.Join(f, "") != args {
			t.Errorf("fragments(%q) = %q, want 2+ pieces that join back", args, f)
		}
	}
}

func FuzzParseText(f *testing.F) {
	for _, s := range []string{
		"[sim fail=overloaded times=2] hi",
		`[sim tool=x args={"a":[1,"]"]}]`,
		`[sim reply="a]b" delay=1s]`,
		"[sim", "[sim ]", "[sim think", "[simple]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ds, text, err := parseText(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidDirective) {
				t.Fatalf("parseText(%q) error %v does not wrap ErrInvalidDirective", s, err)
			}
			return
		}
		if len(text) > len(s)+len(ds) {
			t.Fatalf("parseText(%q) text %q grew", s, text)
		}
		for _, d := range ds {
			if _, ok := actionOptions[d.action]; !ok || !strings.HasPrefix(d.raw, "[sim") || !strings.HasSuffix(d.raw, "]") {
				t.Fatalf("parseText(%q) gave a bad directive %+v", s, d)
			}
		}
	})
}
