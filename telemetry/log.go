package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/runtime"
)

// TurnLog is a [runtime.Observer] that writes one line per turn, when the
// turn ends: what an operator needs to follow it without a trace. Build
// it with [NewTurnLog].
type TurnLog struct {
	runtime.NopObserver
	logger *slog.Logger
}

var _ runtime.Observer = (*TurnLog)(nil)

// NewTurnLog returns a TurnLog writing to logger.
func NewTurnLog(logger *slog.Logger) *TurnLog { return &TurnLog{logger: logger} }

// TurnEnd writes the turn's line: "turn ended" with turn_id; trace_id
// when the turn is traced; client when a key sent it; metadata, a group of
// the request's metadata (at most 16 keys of 64 bytes and values of 256,
// by the request's bounds; user data the client chose to label the turn
// with, which it must not put secrets in); model (the alias
// asked for); attempts, a group of the models tried, in order, with the
// model calls each got; deployments, for the models of several
// deployments tried, the deployment of each of their calls, in order
// (deployments.fast=a,b); served_by (the model whose reply was last
// committed); model_calls, retries, fallbacks, hedges, compactions,
// tool_calls; approvals_requested, approvals_denied and steered when a
// tool call waited for approval or a steering message came; input_tokens (cached input excluded), output_tokens,
// cache_read_tokens, cache_write_tokens; ttft_ms (to the first streamed output), wait_ms
// (backoff), duration_ms; then end_reason for a completed turn, or
// error_code, retryable and the root cause (cut at 4 KiB here, and every value at 1 KiB by
// the redacting handler `turnstile serve` logs through) for a failed one. Durations are
// milliseconds and every count a number. No prompt or completion text is
// logged, and the cause comes from errors whose text the providers have
// already stripped of keys.
//
// A completed turn logs at INFO, as does one the caller cancelled or let
// expire; a failed turn at WARN, and at ERROR when its code is INTERNAL.
func (l *TurnLog) TurnEnd(ctx context.Context, t runtime.TurnInfo, end runtime.TurnEnd) {
	level := slog.LevelInfo
	if e := end.Err; e != nil {
		switch e.Kind {
		case llm.KindInternal:
			level = slog.LevelError
		case llm.KindCancelled, llm.KindDeadlineExceeded:
		default:
			level = slog.LevelWarn
		}
	}
	if !l.logger.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 24)
	attrs = append(attrs, slog.String("turn_id", t.TurnID))
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
	}
	if c := client(t); c != "" {
		attrs = append(attrs, slog.String("client", c))
	}
	if t.Request != nil && len(t.Request.Metadata) > 0 {
		keys := slices.Sorted(maps.Keys(t.Request.Metadata))
		md := make([]any, 0, len(keys))
		for _, k := range keys {
			md = append(md, slog.String(k, t.Request.Metadata[k]))
		}
		attrs = append(attrs, slog.Group("metadata", md...))
	}
	attrs = append(attrs, slog.String("model", t.Model))
	if len(end.Attempts) > 0 {
		tried := make([]any, 0, len(end.Attempts))
		for _, a := range end.Attempts {
			tried = append(tried, slog.Int(a.Model, a.Attempts))
		}
		attrs = append(attrs, slog.Group("attempts", tried...))
		var deps []any
		for _, a := range end.Attempts {
			if len(a.Deployments) > 0 {
				deps = append(deps, slog.String(a.Model, strings.Join(a.Deployments, ",")))
			}
		}
		if len(deps) > 0 {
			attrs = append(attrs, slog.Group("deployments", deps...))
		}
	}
	if end.ServedBy != "" {
		attrs = append(attrs, slog.String("served_by", end.ServedBy))
	}
	c, u := end.Counters, end.Usage
	attrs = append(attrs,
		slog.Int("model_calls", c.ModelCalls),
		slog.Int("retries", c.Retries),
		slog.Int("fallbacks", c.Fallbacks),
		slog.Int("hedges", c.Hedges),
		slog.Int("compactions", c.Compactions),
		slog.Int("tool_calls", c.ToolCalls),
	)
	if c.ApprovalsRequested > 0 || c.Steered > 0 {
		// A turn a person took part in; the decisions themselves (who,
		// when) are events of the turn's log and span.
		attrs = append(attrs,
			slog.Int("approvals_requested", c.ApprovalsRequested),
			slog.Int("approvals_denied", c.ApprovalsDenied),
			slog.Int("steered", c.Steered),
		)
	}
	attrs = append(attrs,
		slog.Int64("input_tokens", u.InputTokens),
		slog.Int64("output_tokens", u.OutputTokens),
		slog.Int64("cache_read_tokens", u.CacheReadTokens),
		slog.Int64("cache_write_tokens", u.CacheWriteTokens),
	)
	if u.Cost.Priced {
		// Exact, as on the wire; absent when no call had a price.
		attrs = append(attrs, slog.String("cost", llm.FormatMoney(u.Cost.Nanos)), slog.String("currency", u.Cost.Currency))
		if u.Cost.Unpriced {
			attrs = append(attrs, slog.Bool("cost_partial", true))
		}
	}
	if end.TimeToFirstOutput > 0 {
		attrs = append(attrs, slog.Float64("ttft_ms", ms(end.TimeToFirstOutput)))
	}
	attrs = append(attrs,
		slog.Float64("wait_ms", ms(end.Waited)),
		slog.Float64("duration_ms", ms(end.Duration)),
	)
	switch e := end.Err; {
	case e != nil:
		attrs = append(attrs, slog.String("error_code", e.Kind.String()))
		if e.Retryable != nil {
			attrs = append(attrs, slog.Bool("retryable", *e.Retryable))
		}
		attrs = append(attrs, slog.String("error", e.Message))
		if e.Cause != nil {
			// The root cause, for operators only: it never reaches the client.
			attrs = append(attrs, slog.String("cause", clip(e.Cause.Error(), maxCauseBytes)))
		}
	case end.Completed != nil:
		attrs = append(attrs, slog.String("end_reason", end.Completed.Reason.String()))
	}
	l.logger.LogAttrs(ctx, level, "turn ended", attrs...)
}

// maxCauseBytes bounds the root cause on a line: a provider's error body
// can be long.
const maxCauseBytes = 4096

// clip cuts s to at most n bytes on a rune boundary, saying how much was
// cut, with invalid UTF-8 replaced.
func clip(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", strings.ToValidUTF8(s[:cut], "\uFFFD"), len(s)-cut)
}

// ms returns d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
