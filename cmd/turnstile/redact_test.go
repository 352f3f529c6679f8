package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

func TestRedactHandler(t *testing.T) {
	var out bytes.Buffer
	const secret = "sk-redact-me-0123"
	logger := slog.New(newRedactHandler(slog.NewJSONHandler(&out, nil), []string{secret}))
	logger.With("early", "key="+secret).WithGroup("g").Info("message "+secret,
		"plain", secret,
		"err", errors.New("failed with "+secret),
		slog.Group("inner", "deep", "x"+secret),
		"list", []string{"a", secret},
		"count", 3,
	)
	got := out.String()
	if strings.Contains(got, secret) {
		t.Errorf("the secret is in the line: %s", got)
	}
	for _, want := range []string{`"msg":"message [redacted]"`, `"early":"key=[redacted]"`, `"plain":"[redacted]"`,
		`"err":"failed with [redacted]"`, `"deep":"x[redacted]"`, `"count":3`} {
		if !strings.Contains(got, want) {
			t.Errorf("line %s lacks %s", got, want)
		}
	}
}

// TestRedactHandlerBounds: every text value, and the message, is cut to
// maxAttrBytes on a rune boundary with its size noted; an error and a
// value in a group too; secrets are replaced before the cut.
func TestRedactHandlerBounds(t *testing.T) {
	var out bytes.Buffer
	const secret = "sk-bound-0123"
	logger := slog.New(newRedactHandler(slog.NewJSONHandler(&out, nil), []string{secret}))
	long := strings.Repeat("é", 3000) // 6000 bytes
	logger.Info("m", "s", long, "err", errors.New(long), slog.Group("g", "in", long),
		"edge", strings.Repeat("x", maxAttrBytes-10)+secret)
	got := out.String()
	if n := strings.Count(got, "…[cut: 6000 bytes in all]"); n != 3 {
		t.Errorf("%d values cut with their size noted, want 3: %.400s", n, got)
	}
	if strings.Contains(got, secret[:6]) || strings.Contains(got, "\\ufffd") {
		t.Errorf("a secret's start or a broken rune is in the line")
	}
	if len(got) > 4*maxAttrBytes+600 {
		t.Errorf("line of %d bytes", len(got))
	}
}
