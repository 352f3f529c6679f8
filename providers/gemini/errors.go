package gemini

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genai"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// statusKinds maps the google.rpc status names Gemini sends to a class,
// for errors that say nothing more specific.
var statusKinds = map[string]llm.Kind{
	"INVALID_ARGUMENT":    llm.KindInvalidRequest,
	"FAILED_PRECONDITION": llm.KindAuth, // unsupported location, billing not enabled
	"OUT_OF_RANGE":        llm.KindInvalidRequest,
	"UNAUTHENTICATED":     llm.KindAuth,
	"PERMISSION_DENIED":   llm.KindAuth,
	"NOT_FOUND":           llm.KindNotFound,
	"RESOURCE_EXHAUSTED":  llm.KindRateLimited,
	"UNAVAILABLE":         llm.KindOverloaded,
	"INTERNAL":            llm.KindServerError,
	"UNKNOWN":             llm.KindServerError,
	"DEADLINE_EXCEEDED":   llm.KindServerError,
	"ABORTED":             llm.KindServerError,
	"CANCELLED":           llm.KindServerError,
}

// details are the google.rpc details of an error that classification uses.
type details struct {
	retryDelay time.Duration
	quotaIDs   []string
	reasons    []string
}

func parseDetails(ds []map[string]any) details {
	var out details
	for _, d := range ds {
		typ, _ := d["@type"].(string)
		switch {
		case strings.HasSuffix(typ, "google.rpc.RetryInfo"):
			if s, ok := d["retryDelay"].(string); ok {
				if dur, ok := httpfail.ParseDuration(s); ok {
					out.retryDelay = dur
				}
			}
		case strings.HasSuffix(typ, "google.rpc.QuotaFailure"):
			// Re-decode the violations rather than walk []any by hand.
			b, _ := json.Marshal(d["violations"])
			var vs []struct {
				QuotaID string `json:"quotaId"`
			}
			if json.Unmarshal(b, &vs) == nil {
				for _, v := range vs {
					out.quotaIDs = append(out.quotaIDs, v.QuotaID)
				}
			}
		case strings.HasSuffix(typ, "google.rpc.ErrorInfo"):
			if r, ok := d["reason"].(string); ok {
				out.reasons = append(out.reasons, r)
			}
		}
	}
	return out
}

// kindOf classifies an APIError: credentials and quota details first, a
// documented fragment for an oversized input, then the status name, then
// the HTTP code.
func kindOf(e genai.APIError, det details) llm.Kind {
	for _, r := range det.reasons {
		switch r {
		case "API_KEY_INVALID", "API_KEY_EXPIRED", "API_KEY_SERVICE_BLOCKED":
			return llm.KindAuth
		}
	}
	if e.Code == http.StatusTooManyRequests || e.Status == "RESOURCE_EXHAUSTED" {
		for _, id := range det.quotaIDs {
			if strings.Contains(id, "PerDay") {
				return llm.KindQuotaExhausted
			}
		}
	}
	if k, ok := httpfail.MatchFragment(httpfail.ScopeGemini, e.Message); ok {
		return k
	}
	if k, ok := statusKinds[e.Status]; ok {
		return k
	}
	if e.Code != 0 {
		return httpfail.StatusKind(e.Code)
	}
	return llm.KindServerError
}

// classify turns the error that ended a stream into a [*llm.Error]. rec
// holds the HTTP response's status and headers; responseID is the last
// response id streamed, used when the headers carry no request id.
func (p *Provider) classify(err error, rec *response, responseID string) *llm.Error {
	// Err goes to logs: keep the key out of it too.
	err = httpfail.RedactErr(err, p.secrets...)
	code, id := rec.get()
	if id == "" {
		id = responseID
	}
	var ae genai.APIError
	if !errors.As(err, &ae) {
		e := httpfail.Untyped(p.name, code, id, err)
		if e.Kind == llm.KindInternal && strings.Contains(err.Error(), "iterateResponseStream") {
			// The SDK reports an undecodable chunk with fmt.Errorf and no
			// type; its function name is the only mark it leaves.
			e.Kind, e.Message = llm.KindServerError, httpfail.MalformedEvent
		}
		return e
	}
	det := parseDetails(ae.Details)
	r := httpfail.Reported{Kind: kindOf(ae, det), Message: ae.Message, StatusCode: code, RequestID: id, Header: rec.headers()}
	if r.StatusCode == 0 {
		r.StatusCode = ae.Code
	}
	if r.Message == "" || !rpcStatus(ae.Status) {
		// Without a google.rpc status the SDK put the raw body in Message
		// (an HTML page from a proxy, say): not a message for people.
		r.Message = httpfail.StatusMessage(ae.Code)
	}
	if r.Kind == llm.KindRateLimited || r.Kind == llm.KindOverloaded || ae.Code >= 500 {
		r.RetryAfter = det.retryDelay
		if r.RetryAfter == 0 {
			r.RetryAfter = httpfail.RetryAfter(r.Header, time.Now())
		}
	}
	return r.Error(p.name, p.secrets, err)
}

// rpcStatus reports whether s is a google.rpc status name such as
// UNAVAILABLE, rather than an HTTP status line the SDK substituted for a
// body that was not a JSON error.
func rpcStatus(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && r != '_' {
			return false
		}
	}
	return true
}
