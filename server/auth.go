package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
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

// key is a Key as the server keeps it, with its limiter.
type key struct {
	Key
	limiter *keyLimiter
}

func (k *key) name() string {
	if k == nil {
		return ""
	}
	return k.Name
}

// mayUse reports whether the key may name model alias.
func (k *key) mayUse(alias string) bool {
	return k == nil || k.Models == nil || slices.Contains(k.Models, alias)
}

// authenticator checks bearer tokens against the configured keys.
type authenticator struct{ keys []*key }

func newAuthenticator(keys []Key, now func() time.Time) *authenticator {
	a := &authenticator{}
	for _, k := range keys {
		a.keys = append(a.keys, &key{Key: k, limiter: newKeyLimiter(k.Name, k.Limits, now)})
	}
	return a
}

// authenticate is the [auth.AuthFunc]: it finds the key whose token the
// request carries in "authorization: Bearer <token>", and puts it in the
// context and its name on the RPC's log line.
func (a *authenticator) authenticate(ctx context.Context) (context.Context, error) {
	token, err := auth.AuthFromMD(ctx, "bearer")
	if err != nil {
		return nil, unauthenticated("missing client key: send the metadata \"authorization: Bearer <token>\"").Err()
	}
	k := a.find(token)
	if k == nil {
		return nil, unauthenticated("invalid client key").Err()
	}
	logging.AddFields(ctx, logging.Fields{"client", k.Name})
	return context.WithValue(ctx, keyContext{}, k), nil
}

// find returns the key whose digest is token's, nil when none is. It
// compares digests in constant time and always looks at every key, so its
// timing tells nothing about how close a guess was.
func (a *authenticator) find(token string) *key {
	sum := sha256.Sum256([]byte(token))
	var found *key
	for _, k := range a.keys {
		if subtle.ConstantTimeCompare(sum[:], k.TokenSHA256[:]) == 1 {
			found = k
		}
	}
	return found
}

// requireKey returns the interceptors that require a key on every RPC but
// the health service's, which load balancers call without one.
func (a *authenticator) requireKey() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	notHealth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthpb.Health_ServiceDesc.ServiceName
	})
	return selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(a.authenticate), notHealth),
		selector.StreamServerInterceptor(auth.StreamServerInterceptor(a.authenticate), notHealth)
}

// modelFor checks the model a request of key k names, and returns the
// alias the turn runs on: the request's, or for a request naming none, the
// server's default when k may use it, else k's first model. It returns a
// status when k may not use the model, or the model is unknown (listing
// only the models k may use).
func modelFor(k *key, requested, defaultModel string, known []string) (string, *status.Status) {
	if k == nil || k.Models == nil {
		return requested, nil
	}
	alias := requested
	if alias == "" {
		alias = defaultModel
		if !k.mayUse(alias) && len(k.Models) > 0 {
			alias = k.Models[0]
		}
	}
	if k.mayUse(alias) {
		return alias, nil
	}
	if !slices.Contains(known, alias) {
		mine := []string{}
		for _, m := range k.Models {
			if slices.Contains(known, m) {
				mine = append(mine, m)
			}
		}
		return "", invalidArgument([]*runtime.FieldError{{Field: "model",
			Description: fmt.Sprintf("unknown model %s; this client key may use: %s", wire.Quote(alias), strings.Join(mine, ", "))}})
	}
	return "", permissionDenied(fmt.Sprintf("client key %q may not use model %s", k.Name, wire.Quote(alias)),
		map[string]string{"model": alias, "client": k.Name})
}
