package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestScanner(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		str    string
		strOK  bool
		n      int64
		intOK  bool
		skipOK bool
	}{
		{in: `"plain"`, str: "plain", strOK: true, skipOK: true},
		{in: `"esc \" \\ \/ \b \f \n \r \t \u00e9 \u2603"`, str: "esc \" \\ / \b \f \n \r \t é ☃", strOK: true, skipOK: true},
		{in: `"é ☃ 😀"`, str: "é ☃ 😀", strOK: true, skipOK: true},
		{in: `"\ud83d\ude00"`, skipOK: true}, // surrogates: declined
		{in: "\"bad \xff\"", skipOK: true},   // invalid UTF-8: declined, but JSON
		{in: "\"ctl \x01\""},                 // a control character: not JSON
		{in: `"\x"`},                         // a bad escape
		{in: `"open`},                        // unterminated
		{in: `12`, n: 12, intOK: true, skipOK: true},
		{in: `-7`, n: -7, intOK: true, skipOK: true},
		{in: `0`, intOK: true, skipOK: true},
		{in: `012`},                            // a leading zero: not JSON
		{in: `1.5`, skipOK: true},              // not an integer
		{in: `1e3`, skipOK: true},              // not an integer
		{in: `1234567890123456`, skipOK: true}, // too long to be read exactly everywhere
		{in: `-`},
		{in: `{"a":[1,{"b":null}],"c":true,"d":false}`, skipOK: true},
		{in: `{"a":1,}`},
		{in: `[1,2`},
		{in: `nul`},
	}
	for _, tt := range tests {
		s := New([]byte(tt.in))
		str, ok := s.String()
		if ok != tt.strOK || str != tt.str {
			t.Errorf("String(%s) = %q, %v; want %q, %v", tt.in, str, ok, tt.str, tt.strOK)
		}
		s = New([]byte(tt.in))
		n, ok := s.Int()
		if ok && !s.End() {
			ok = false
		}
		if ok != tt.intOK || n != tt.n {
			t.Errorf("Int(%s) = %d, %v; want %d, %v", tt.in, n, ok, tt.n, tt.intOK)
		}
		s = New([]byte(tt.in))
		if ok := s.Skip() && s.End(); ok != tt.skipOK {
			t.Errorf("Skip(%s) = %v, want %v", tt.in, ok, tt.skipOK)
		}
	}
}

func TestRaw(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, raw string
		ok      bool
	}{
		{in: ` {"a": [1, "x"]} ,`, raw: `{"a": [1, "x"]}`, ok: true},
		{in: "\n\tnull", raw: "null", ok: true},
		{in: `"s\u00e9"`, raw: `"s\u00e9"`, ok: true},
		{in: `-1.5e3]`, raw: `-1.5e3`, ok: true},
		{in: `{"a":}`},
		{in: ``},
	}
	for _, tt := range tests {
		s := New([]byte(tt.in))
		raw, ok := s.Raw()
		if ok != tt.ok || string(raw) != tt.raw {
			t.Errorf("Raw(%q) = %q, %v; want %q, %v", tt.in, raw, ok, tt.raw, tt.ok)
		}
	}
}

// FuzzScanner holds the scanner to encoding/json: what it skips as valid
// is valid JSON, and a string or integer it reads has the value
// encoding/json reads.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`"a\u00e9\n"`, `{"a":[1,-2.5e3,"x",null,true]}`, `12`, `"\ud83d"`, "\"\xff\"", `[[[]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := New(b)
		if s.Skip() && s.End() && !json.Valid(b) {
			t.Errorf("Skip accepted invalid JSON %q", b)
		}
		s = New(b)
		if str, ok := s.String(); ok && s.End() {
			var want string
			if err := json.Unmarshal(b, &want); err != nil || want != str {
				t.Errorf("String(%q) = %q; encoding/json reads %q (%v)", b, str, want, err)
			}
		}
		s = New(b)
		if n, ok := s.Int(); ok && s.End() {
			var want int64
			if err := json.Unmarshal(b, &want); err != nil || want != n {
				t.Errorf("Int(%q) = %d; encoding/json reads %d (%v)", b, n, want, err)
			}
		}
	})
}

func TestOrNull(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in    string
		str   string
		strOK bool
		n     int64
		intOK bool
	}{
		{in: `null`, strOK: true, intOK: true},
		{in: `"a\n"`, str: "a\n", strOK: true},
		{in: `-3`, n: -3, intOK: true},
		{in: `nul`},
		{in: `1.5`},
	}
	for _, tt := range tests {
		str, n := "before", int64(9)
		s := New([]byte(tt.in))
		if ok := s.StringOrNull(&str) && s.End(); ok != tt.strOK || ok && str != tt.str {
			t.Errorf("StringOrNull(%s) = %q, %v; want %q, %v", tt.in, str, ok, tt.str, tt.strOK)
		}
		s = New([]byte(tt.in))
		if ok := s.IntOrNull(&n) && s.End(); ok != tt.intOK || ok && n != tt.n {
			t.Errorf("IntOrNull(%s) = %d, %v; want %d, %v", tt.in, n, ok, tt.n, tt.intOK)
		}
	}
	var k Keys
	if !k.Once(1) || !k.Once(4) || k.Once(1) || k.Once(4) || !k.Once(2) {
		t.Errorf("Keys.Once: a bit recorded twice, or a new one refused (%08b)", k)
	}
}
