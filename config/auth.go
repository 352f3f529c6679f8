package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"

	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

var (
	// keyName is a client key's name: it goes on log lines and metrics.
	keyName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// sha256Hex is a SHA-256 digest in hex.
	sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// checkAuth checks the client keys. Messages never quote a token, a
// digest or a variable's value.
func (c *Config) checkAuth(v *checker) {
	digests := map[string]string{}
	for i, k := range c.Auth.Keys {
		path := fmt.Sprintf("auth.keys[%d]", i)
		switch {
		case k.Name == "":
			v.at(path+".name", "required: a name for logs")
		case !keyName.MatchString(k.Name):
			v.at(path+".name", "must be 1 to 64 letters, digits, '_', '.' or '-'")
		case slices.ContainsFunc(c.Auth.Keys[:i], func(o AuthKey) bool { return o.Name == k.Name }):
			v.at(path+".name", "%q names another key too", k.Name)
		}
		switch {
		case k.TokenEnv == "" && k.TokenSHA256 == "":
			v.at(path, "set token_env (the variable holding the token) or token_sha256 (its SHA-256 digest)")
		case k.TokenEnv != "" && k.TokenSHA256 != "":
			v.at(path, "set token_env or token_sha256, not both")
		case k.TokenEnv != "" && !envName.MatchString(k.TokenEnv):
			v.at(path+".token_env", "must be the name of an environment variable (letters, digits and _), not the token itself (the value is not shown)")
		case k.TokenSHA256 != "" && !sha256Hex.MatchString(k.TokenSHA256):
			v.at(path+".token_sha256", "must be the SHA-256 digest of the token, 64 hex digits (the value is not shown); for example: printf %%s \"$TOKEN\" | sha256sum")
		case k.TokenSHA256 != "":
			d := string(mustHex(k.TokenSHA256))
			if other, dup := digests[d]; dup {
				v.at(path+".token_sha256", "is also the digest of key %q: keys must have their own tokens", other)
			}
			digests[d] = k.Name
		}
		for j, m := range k.Models {
			at := fmt.Sprintf("%s.models[%d]", path, j)
			_, ok := c.Models[m]
			switch {
			case !ok:
				v.at(at, "%q is not a configured model%s", m, didYouMean(m, sortedKeys(c.Models)))
			case slices.Contains(k.Models[:j], m):
				v.at(at, "%q appears twice", m)
			}
		}
		v.settings(path+".limits", k.Limits.Problems(), false)
	}
}

func mustHex(s string) []byte {
	b, _ := hex.DecodeString(s)
	return b
}

// checkAuthEnv reports, into v, the token variables that lookup finds
// unset or empty, and tokens two keys share.
func (c *Config) checkAuthEnv(v *checker, lookup func(string) (string, bool)) {
	seen := map[[sha256.Size]byte]string{}
	for i, k := range c.Auth.Keys {
		path := fmt.Sprintf("auth.keys[%d]", i)
		var sum [sha256.Size]byte
		if k.TokenEnv != "" {
			switch val, ok := lookup(k.TokenEnv); {
			case !ok:
				v.at(path+".token_env", "the environment variable %s is not set", k.TokenEnv)
				continue
			case val == "":
				v.at(path+".token_env", "the environment variable %s is empty", k.TokenEnv)
				continue
			default:
				sum = sha256.Sum256([]byte(val))
			}
		} else {
			copy(sum[:], mustHex(k.TokenSHA256))
		}
		if other, dup := seen[sum]; dup {
			field := ".token_sha256"
			if k.TokenEnv != "" {
				field = ".token_env"
			}
			v.at(path+field, "holds the same token as key %q: keys must have their own tokens", other)
		}
		seen[sum] = k.Name
	}
}

// DefaultStoredBytes is the stored_bytes of a key whose limits leave it
// out: a quarter of store.max_bytes, so no one key's running turns hold
// the store; 0 (none) without a store or a bound on it.
func (c *Config) DefaultStoredBytes() int64 {
	if c.Store.Mode == store.ModeOff || c.Store.MaxBytes <= 0 {
		return 0
	}
	return c.Store.MaxBytes / 4
}

// Keys returns the client keys for the server, their tokens read through
// getenv and kept only as digests. Call it after [Config.CheckEnv].
func (c *Config) Keys(getenv func(string) string) []server.Key {
	var keys []server.Key
	for _, k := range c.Auth.Keys {
		sk := server.Key{Name: k.Name, Models: k.Models, Limits: k.Limits}
		if k.TokenEnv != "" {
			sk.TokenSHA256 = sha256.Sum256([]byte(getenv(k.TokenEnv)))
		} else {
			copy(sk.TokenSHA256[:], mustHex(k.TokenSHA256))
		}
		if len(sk.Models) == 0 {
			sk.Models = nil
		}
		if n := c.DefaultStoredBytes(); sk.Limits.StoredBytes == nil && n > 0 {
			sk.Limits.StoredBytes = &n
		}
		keys = append(keys, sk)
	}
	return keys
}
