// Package jsonscan reads the few fields a provider adapter needs out of a
// streamed JSON event without building anything else: no reflection, no
// intermediate values, no allocation but the strings it returns.
//
// It is deliberately narrow. It accepts only what it is sure every JSON
// decoder reads the same way: a [Scanner] reports failure (ok false) on
// anything else — invalid JSON, but also valid JSON it does not take on,
// such as strings with invalid UTF-8 or surrogate escapes, keys with
// escapes, numbers where an integer is expected that are not plain
// integers, or nesting deeper than [MaxDepth]. An adapter then decodes
// that event with its SDK instead, which stays the source of truth for
// every event the fast path declines; each adapter proves with a
// conformance test and a fuzz target that the two yield the same.
//
// The package imports only the standard library.
package jsonscan

import (
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting a [Scanner] skips over.
const MaxDepth = 64

// Scanner reads one JSON document. The zero value is not usable: use
// [New]. Every method returns ok false when the input is not of the
// accepted form; the scanner is then of no further use.
type Scanner struct {
	b   []byte
	pos int
}

// New returns a scanner over b. It does not copy b.
func New(b []byte) Scanner { return Scanner{b: b} }

func (s *Scanner) ws() {
	for s.pos < len(s.b) {
		switch s.b[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// End reports whether only whitespace is left.
func (s *Scanner) End() bool {
	s.ws()
	return s.pos == len(s.b)
}

// Null consumes a null and reports whether there was one; it consumes
// nothing otherwise.
func (s *Scanner) Null() bool {
	s.ws()
	if len(s.b)-s.pos >= 4 && string(s.b[s.pos:s.pos+4]) == "null" {
		s.pos += 4
		return true
	}
	return false
}

// Peek returns the first byte of the next value, 0 at the end.
func (s *Scanner) Peek() byte {
	s.ws()
	if s.pos == len(s.b) {
		return 0
	}
	return s.b[s.pos]
}

// Object reads an object, calling field for each key with the scanner
// positioned at its value; field must consume the value (with a read or
// [Scanner.Skip]) and return false to give up. Keys are returned as they
// are written: a key with an escape is not accepted. The key's bytes are
// valid only during the call.
func (s *Scanner) Object(field func(key []byte) bool) bool {
	s.ws()
	if s.pos >= len(s.b) || s.b[s.pos] != '{' {
		return false
	}
	s.pos++
	s.ws()
	if s.pos < len(s.b) && s.b[s.pos] == '}' {
		s.pos++
		return true
	}
	for {
		s.ws()
		key, ok := s.rawKey()
		if !ok {
			return false
		}
		s.ws()
		if s.pos >= len(s.b) || s.b[s.pos] != ':' {
			return false
		}
		s.pos++
		if !field(key) {
			return false
		}
		s.ws()
		if s.pos >= len(s.b) {
			return false
		}
		switch s.b[s.pos] {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return true
		default:
			return false
		}
	}
}

// Array reads an array, calling elem with the scanner positioned at each
// element; elem must consume it and return false to give up.
func (s *Scanner) Array(elem func() bool) bool {
	s.ws()
	if s.pos >= len(s.b) || s.b[s.pos] != '[' {
		return false
	}
	s.pos++
	s.ws()
	if s.pos < len(s.b) && s.b[s.pos] == ']' {
		s.pos++
		return true
	}
	for {
		if !elem() {
			return false
		}
		s.ws()
		if s.pos >= len(s.b) {
			return false
		}
		switch s.b[s.pos] {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return true
		default:
			return false
		}
	}
}

// plain marks the bytes a string holds as they are: printable ASCII but
// the quote and the backslash. Scanning a run of them is one table load a
// byte.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainRun returns the end of the run of plain bytes of b from i.
func plainRun(b []byte, i int) int {
	for i < len(b) && plain[b[i]] {
		i++
	}
	return i
}

// rawKey reads a string without escapes and returns its bytes.
func (s *Scanner) rawKey() ([]byte, bool) {
	if s.pos >= len(s.b) || s.b[s.pos] != '"' {
		return nil, false
	}
	start := s.pos + 1
	i := plainRun(s.b, start)
	if i < len(s.b) && s.b[i] == '"' {
		s.pos = i + 1
		return s.b[start:i], true
	}
	return nil, false
}

// String reads a string and returns it unescaped. It accepts only valid
// UTF-8 and escapes other than surrogate halves.
func (s *Scanner) String() (string, bool) {
	s.ws()
	if s.pos >= len(s.b) || s.b[s.pos] != '"' {
		return "", false
	}
	start := s.pos + 1
	i := plainRun(s.b, start)
	ascii := true
	for ; i < len(s.b); i++ {
		c := s.b[i]
		if c == '"' {
			break
		}
		if c == '\\' {
			return s.escaped(start)
		}
		if c < 0x20 {
			return "", false
		}
		if c >= 0x80 {
			ascii = false
		}
	}
	if i >= len(s.b) {
		return "", false
	}
	raw := s.b[start:i]
	if !ascii && !utf8.Valid(raw) {
		return "", false
	}
	s.pos = i + 1
	return string(raw), true
}

// escaped reads the rest of a string that has an escape, from start.
func (s *Scanner) escaped(start int) (string, bool) {
	out := make([]byte, 0, 2*(len(s.b)-start)/3+8)
	for i := start; i < len(s.b); {
		c := s.b[i]
		switch {
		case c == '"':
			if !utf8.Valid(out) {
				return "", false
			}
			s.pos = i + 1
			return string(out), true
		case c < 0x20:
			return "", false
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(s.b) {
			return "", false
		}
		switch e := s.b[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(s.b[i+2:])
			if !ok || utf16.IsSurrogate(r) {
				return "", false
			}
			out = utf8.AppendRune(out, r)
			i += 4
		default:
			return "", false
		}
		i += 2
	}
	return "", false
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// Int reads an integer written without fraction or exponent, of at most
// 15 digits (so that every decoder reads it exactly).
func (s *Scanner) Int() (int64, bool) {
	s.ws()
	i := s.pos
	neg := false
	if i < len(s.b) && s.b[i] == '-' {
		neg = true
		i++
	}
	digits := i
	var n int64
	for i < len(s.b) && '0' <= s.b[i] && s.b[i] <= '9' {
		n = n*10 + int64(s.b[i]-'0')
		i++
	}
	switch {
	case i == digits, i-digits > 15, s.b[digits] == '0' && i-digits > 1:
		return 0, false
	}
	if i < len(s.b) {
		switch s.b[i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	s.pos = i
	if neg {
		n = -n
	}
	return n, true
}

// StringOrNull reads a string into dst, or null as the empty string.
func (s *Scanner) StringOrNull(dst *string) bool {
	if s.Null() {
		*dst = ""
		return true
	}
	v, ok := s.String()
	*dst = v
	return ok
}

// IntOrNull reads an integer, as [Scanner.Int] does, into dst, or null
// as zero.
func (s *Scanner) IntOrNull(dst *int64) bool {
	if s.Null() {
		*dst = 0
		return true
	}
	v, ok := s.Int()
	*dst = v
	return ok
}

// Keys records which of up to eight keys of one object were read, one bit
// each, so that a decoder can decline an object that repeats one (JSON
// decoders differ on which of the two they keep).
type Keys uint8

// Once records bit and reports whether it was not recorded before.
func (k *Keys) Once(bit uint8) bool {
	if uint8(*k)&bit != 0 {
		return false
	}
	*k |= Keys(bit)
	return true
}

// Skip consumes one value of any kind, checking that it is valid JSON.
func (s *Scanner) Skip() bool { return s.skip(0) }

// Raw consumes one value of any kind, as [Scanner.Skip] does, and returns
// its text as it is written, without the whitespace around it. The slice
// shares the scanner's input.
func (s *Scanner) Raw() ([]byte, bool) {
	s.ws()
	start := s.pos
	if !s.skip(0) {
		return nil, false
	}
	return s.b[start:s.pos], true
}

func (s *Scanner) skip(depth int) bool {
	if depth > MaxDepth {
		return false
	}
	s.ws()
	if s.pos >= len(s.b) {
		return false
	}
	switch c := s.b[s.pos]; {
	case c == '{':
		return s.Object(func([]byte) bool { return s.skip(depth + 1) })
	case c == '[':
		return s.Array(func() bool { return s.skip(depth + 1) })
	case c == '"':
		return s.skipString()
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(s.b)-s.pos >= len(lit) && string(s.b[s.pos:s.pos+len(lit)]) == lit {
			s.pos += len(lit)
			return true
		}
	}
	return false
}

// skipString consumes a string, checking its escapes.
func (s *Scanner) skipString() bool {
	for i := plainRun(s.b, s.pos+1); i < len(s.b); i = plainRun(s.b, i+1) {
		switch c := s.b[i]; {
		case c == '"':
			s.pos = i + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if i+1 >= len(s.b) {
				return false
			}
			switch s.b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if _, ok := hex4(s.b[i+2:]); !ok {
					return false
				}
				i += 5
			default:
				return false
			}
		}
	}
	return false
}

// number consumes a number of JSON's grammar.
func (s *Scanner) number() bool {
	i := s.pos
	if s.b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s.b) && '0' <= s.b[i] && s.b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(s.b) && s.b[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s.b) && s.b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s.b) && (s.b[i] == 'e' || s.b[i] == 'E') {
		i++
		if i < len(s.b) && (s.b[i] == '+' || s.b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	s.pos = i
	return true
}
