package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstile-dev/turnstile/llm"
)

// cooldown is the value of a model's key in the cooldown bucket.
type cooldown struct {
	Kind    string    `json:"kind"`
	Until   time.Time `json:"until"`
	Replica string    `json:"replica"`
}

// ShareCooldown stores that alias is cooling down until until, after a
// failure of class kind, for every replica: the model's key in the
// cooldown bucket, which expires with the cooldown. It does not wait for
// the store (a turn calls it); a failure is logged.
func (s *Shared) ShareCooldown(alias string, kind llm.Kind, until time.Time) {
	ttl := time.Until(until)
	if ttl < time.Second {
		return // too short to be worth telling; per-message TTLs count in seconds
	}
	b, _ := json.Marshal(cooldown{Kind: kind.String(), Until: until.UTC(), Replica: s.id})
	subject := "$KV." + CooldownBucket + "." + base64.RawURLEncoding.EncodeToString([]byte(alias))
	if _, err := s.js.PublishAsync(subject, b, jetstream.WithMsgTTL(ttl.Round(time.Second)+time.Second)); err != nil {
		s.logger.Warn("turn store: cooldown not shared", "model", alias, "error", err)
	}
}

// WatchCooldowns calls fn with each cooldown another replica shares, and
// first with those in force, until ctx is done or the store closes.
func (s *Shared) WatchCooldowns(ctx context.Context, fn func(alias string, kind llm.Kind, until time.Time)) error {
	kinds := map[string]llm.Kind{}
	for _, k := range llm.Kinds() {
		kinds[k.String()] = k
	}
	return s.watch.all(ctx, s.cooldowns, func(e jetstream.KeyValueEntry) {
		if e.Operation() != jetstream.KeyValuePut {
			return
		}
		var c cooldown
		alias, err := base64.RawURLEncoding.DecodeString(e.Key())
		if err != nil || json.Unmarshal(e.Value(), &c) != nil || c.Replica == s.id || time.Now().After(c.Until) {
			return
		}
		fn(string(alias), kinds[c.Kind], c.Until)
	})
}
