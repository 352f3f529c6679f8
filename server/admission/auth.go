package admission

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"slices"
	"time"
)

// Key is a client key: a name for logs, the SHA-256 digest of its bearer
// token (the token itself is never kept), the model aliases it may use and
// its limits.
type Key struct {
	// Name identifies the key in logs, spans and metrics; never secret.
	Name string
	// TokenSHA256 is the SHA-256 digest of the key's bearer token.
	TokenSHA256 [sha256.Size]byte
	// Models lists the model aliases the key may name; nil allows every
	// model. A request that names no model gets the server's default model
	// when the key may use it, else the key's first model.
	Models []string
	// Limits bound what the key may use.
	Limits KeyLimits
}

// Client is a Key as the server keeps it, with its limiter: the caller
// of an RPC, found by its token. A nil *Client is the caller of a server
// without keys, whom nothing limits.
type Client struct {
	Key
	limiter *keyLimiter
}

// KeyName returns the key's name; "" for nil (no keys).
func (k *Client) KeyName() string {
	if k == nil {
		return ""
	}
	return k.Name
}

// MayUse reports whether the key may name model alias.
func (k *Client) MayUse(alias string) bool {
	return k == nil || k.Models == nil || slices.Contains(k.Models, alias)
}

// Keys are the configured client keys, each with its limiter.
type Keys struct{ keys []*Client }

// NewKeys returns the keys, their limits kept on the clock now.
func NewKeys(keys []Key, now func() time.Time) *Keys {
	a := &Keys{}
	for _, k := range keys {
		a.keys = append(a.keys, &Client{Key: k, limiter: newKeyLimiter(k.Name, k.Limits, now)})
	}
	return a
}

// Named returns the client key of that name, nil when there is none (no
// keys, or a key no longer configured).
func (a *Keys) Named(name string) *Client {
	if a == nil || name == "" {
		return nil
	}
	for _, k := range a.keys {
		if k.Name == name {
			return k
		}
	}
	return nil
}

// Find returns the key whose digest is token's, nil when none is. It
// compares digests in constant time and always looks at every key, so its
// timing tells nothing about how close a guess was.
func (a *Keys) Find(token string) *Client {
	sum := sha256.Sum256([]byte(token))
	var found *Client
	for _, k := range a.keys {
		if subtle.ConstantTimeCompare(sum[:], k.TokenSHA256[:]) == 1 {
			found = k
		}
	}
	return found
}

// ModelError is the failure of a request that names a model its client
// key may not use (Known), or one the server does not know, which is the
// request's fault; Allowed lists the known models the key may use.
type ModelError struct {
	Client  string
	Model   string
	Known   bool
	Allowed []string
}

// Error implements error.
func (e *ModelError) Error() string {
	if e.Known {
		return "client key " + e.Client + " may not use model " + e.Model
	}
	return "unknown model " + e.Model
}

// ModelFor checks the model a request of key k names, and returns the
// alias the turn runs on: the request's, or for a request naming none, the
// server's default when k may use it, else k's first model. It fails with
// a *ModelError when k may not use the model, or the model is unknown.
func ModelFor(k *Client, requested, defaultModel string, known []string) (string, error) {
	if k == nil || k.Models == nil {
		return requested, nil
	}
	alias := requested
	if alias == "" {
		alias = defaultModel
		if !k.MayUse(alias) && len(k.Models) > 0 {
			alias = k.Models[0]
		}
	}
	if k.MayUse(alias) {
		return alias, nil
	}
	e := &ModelError{Client: k.Name, Model: alias, Known: slices.Contains(known, alias)}
	if !e.Known {
		e.Allowed = []string{}
		for _, m := range k.Models {
			if slices.Contains(known, m) {
				e.Allowed = append(e.Allowed, m)
			}
		}
	}
	return "", e
}

// clientContext is the context key of the caller's *Client.
type clientContext struct{}

// NewContext returns ctx carrying the caller's client key.
func NewContext(ctx context.Context, k *Client) context.Context {
	return context.WithValue(ctx, clientContext{}, k)
}

// FromContext returns the caller's client key; nil without keys.
func FromContext(ctx context.Context) *Client {
	k, _ := ctx.Value(clientContext{}).(*Client)
	return k
}
