package telemetry_test

import (
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/telemetry"
)

// TestMetadataOnTheTurnSpan: only the metadata keys the options list reach
// the turn's span, as turnstile.metadata.KEY; no other span gets them.
func TestMetadataOnTheTurnSpan(t *testing.T) {
	p := newPipeline(t)
	req := userTurn("hi")
	req.Metadata = map[string]string{"session": "s-1", "end_user": "u-9", "tenant": "acme"}
	scenario(t, observer(t, p, telemetry.ObserverOptions{MetadataAttributes: []string{"tenant", "session", "absent"}}), req)
	spans := p.spans.Ended()
	turn := attrs(named(t, spans, "invoke_agent", 0))
	if turn["turnstile.metadata.session"] != "s-1" || turn["turnstile.metadata.tenant"] != "acme" {
		t.Errorf("turn span attributes %v", turn)
	}
	for _, s := range spans {
		for k := range attrs(s) {
			if k == "turnstile.metadata.end_user" || k == "turnstile.metadata.absent" ||
				(s.Name() != "invoke_agent" && strings.HasPrefix(string(k), "turnstile.metadata.")) {
				t.Errorf("span %s has %s", s.Name(), k)
			}
		}
	}
}
