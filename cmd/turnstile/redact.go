package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"unicode/utf8"
)

// redactHandler is the last line of defence against a secret in a log
// line: it replaces every configured secret value (API keys, header
// values, URL credentials, client tokens) in a record's message and
// attributes before the wrapped handler writes it. The parts that build
// errors redact at the source; this catches what a library logs or
// formats on its own.
//
// It is also where a line's size is bounded: every text value (an
// error, a cause, a model name, a directive: anything a client or an
// upstream wrote) is cut to maxAttrBytes, its original size noted, so
// no line a new call site writes can carry a request whole.
type redactHandler struct {
	next    slog.Handler
	secrets []string
}

// maxAttrBytes bounds the text of a log attribute, and a line's message.
// A provider's 400 may quote the whole request (megabytes); the first
// KiB says what went wrong.
const maxAttrBytes = 1024

func newRedactHandler(next slog.Handler, secrets []string) slog.Handler {
	return &redactHandler{next: next, secrets: secrets}
}

func (h *redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *redactHandler) Handle(ctx context.Context, r slog.Record) error {
	clean := h.clean(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		clean = clean && h.cleanAttr(a)
		return clean
	})
	if clean {
		// Most lines: nothing to redact or cut, no copy.
		return h.next.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, h.redact(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *redactHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		clean[i] = h.attr(a)
	}
	return &redactHandler{next: h.next.WithAttrs(clean), secrets: h.secrets}
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	return &redactHandler{next: h.next.WithGroup(name), secrets: h.secrets}
}

// redact returns s with every secret replaced, cut to maxAttrBytes.
// Secrets are replaced first, so a cut cannot leave half of one.
func (h *redactHandler) redact(s string) string {
	for _, secret := range h.secrets {
		if strings.Contains(s, secret) {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return bound(s, maxAttrBytes)
}

// clean reports whether s has no secret and is within maxAttrBytes.
func (h *redactHandler) clean(s string) bool {
	if len(s) > maxAttrBytes {
		return false
	}
	for _, secret := range h.secrets {
		if strings.Contains(s, secret) {
			return false
		}
	}
	return true
}

// cleanAttr reports whether a would pass [redactHandler.attr] unchanged
// without formatting it: text that is clean, numbers, times, and groups of
// those. A value of another kind (an error) takes the slow path.
func (h *redactHandler) cleanAttr(a slog.Attr) bool {
	switch a.Value.Kind() {
	case slog.KindString:
		return h.clean(a.Value.String())
	case slog.KindGroup:
		for _, g := range a.Value.Group() {
			if !h.cleanAttr(g) {
				return false
			}
		}
		return true
	case slog.KindAny, slog.KindLogValuer:
		return false
	}
	return true
}

// bound cuts s to at most n bytes on a rune boundary, noting the size
// it had: "…[cut: 3145728 bytes in all]".
func bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…[cut: %d bytes in all]", s[:cut], len(s))
}

// attr returns a with secrets redacted from its value, cut to
// maxAttrBytes; a value that is not text is rendered as text when its
// text holds a secret or is longer than that.
func (h *redactHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.redact(v.String()))
	case slog.KindGroup:
		group := v.Group()
		clean := make([]any, len(group))
		for i, g := range group {
			clean[i] = h.attr(g)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		text := fmt.Sprint(v.Any())
		if red := h.redact(text); red != text {
			return slog.String(a.Key, red)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// routeStdLog sends what libraries write with the standard log package
// (the Gemini SDK does) to logger at WARN, as structured lines through
// its handler, so it is redacted and formatted like the rest. It returns
// a function that restores the standard logger.
func routeStdLog(logger *slog.Logger) (restore func()) {
	out, flags := log.Writer(), log.Flags()
	log.SetFlags(0)
	log.SetOutput(slog.NewLogLogger(logger.With("source", "stdlog").Handler(), slog.LevelWarn).Writer())
	return func() {
		log.SetOutput(out)
		log.SetFlags(flags)
	}
}
