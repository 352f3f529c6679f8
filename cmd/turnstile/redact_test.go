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
