package endpoint

import (
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/turnstile-dev/turnstile/llm"
)

// DefaultConnectTimeout bounds dialling and the TLS handshake when the
// file does not set connect_timeout.
const DefaultConnectTimeout = 10 * time.Second

// Settings are the keys every HTTP provider block has. The yaml names are
// the configuration file's keys.
type Settings struct {
	// BaseURL is the API endpoint, an absolute http or https URL.
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable holding the API key; empty
	// sends no key. The key itself is never in the file.
	APIKeyEnv string `yaml:"api_key_env"`
	// Headers are extra HTTP headers sent with every request. Their values
	// are redacted from errors, but they are in the file: put secrets in
	// HeadersFromEnv.
	Headers map[string]string `yaml:"headers"`
	// HeadersFromEnv maps a header name to the environment variable holding
	// its value, sent with every request like Headers.
	HeadersFromEnv map[string]string `yaml:"headers_from_env"`
	// ConnectTimeout bounds dialling and the TLS handshake; positive.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
}

// Defaults returns the settings of a block that sets nothing but its
// type: baseURL, no key, no extra header, [DefaultConnectTimeout].
func Defaults(baseURL string) Settings {
	return Settings{BaseURL: baseURL, ConnectTimeout: DefaultConnectTimeout}
}

var (
	// envName is a portable environment variable name.
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// headerName is an HTTP header field name (an RFC 9110 token).
	headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	// keyPrefixes start API keys of well-known providers.
	keyPrefixes = []string{"sk-", "sk_", "AIza", "xai-", "gsk_", "hf_", "Bearer "}
)

// Check lists every setting that is wrong without looking at the
// environment, in field order; typ names the provider type in messages
// and keyRequired says whether api_key_env must be set. No message quotes
// the value of api_key_env, of base_url or of a header: any of them may
// hold a secret.
func (s Settings) Check(typ string, keyRequired bool) []llm.Problem {
	var out []llm.Problem
	bad := func(field, format string, args ...any) {
		out = append(out, llm.Problem{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	if msg := checkURL(s.BaseURL); msg != "" {
		bad("base_url", "%s", msg)
	}
	switch {
	case s.APIKeyEnv == "" && keyRequired:
		bad("api_key_env", "required for type %s: name the environment variable holding the API key", typ)
	case s.APIKeyEnv != "" && (looksLikeKey(s.APIKeyEnv) || !envName.MatchString(s.APIKeyEnv)):
		bad("api_key_env", "must be the name of an environment variable (letters, digits and _), not the key itself: put the key in a variable and name the variable here (the value is not shown)")
	}
	for _, k := range sortedKeys(s.Headers) {
		if !headerName.MatchString(k) {
			bad("headers", "%q is not a header name", k)
			continue
		}
		if strings.ContainsFunc(s.Headers[k], func(r rune) bool { return r != '\t' && unicode.IsControl(r) }) {
			bad("headers."+k, "the value must be one line without control characters (the value is not shown)")
		}
	}
	for _, k := range sortedKeys(s.HeadersFromEnv) {
		name := s.HeadersFromEnv[k]
		switch {
		case !headerName.MatchString(k):
			bad("headers_from_env", "%q is not a header name", k)
		case looksLikeKey(name) || !envName.MatchString(name):
			bad("headers_from_env."+k, "must be the name of an environment variable (letters, digits and _), not the value itself (the value is not shown)")
		}
		for h := range s.Headers {
			if strings.EqualFold(h, k) {
				bad("headers_from_env."+k, "%q is also set in headers", h)
			}
		}
	}
	if s.ConnectTimeout <= 0 {
		bad("connect_timeout", "must be positive")
	}
	return out
}

// checkURL returns what is wrong with a base URL, or "".
func checkURL(raw string) string {
	if raw == "" {
		return "must not be empty: leave the key out for the provider's own endpoint"
	}
	if !strings.Contains(raw, "://") {
		return "has no scheme: start it with https:// (or http:// for a server without TLS)"
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "is not a valid URL"
	case u.Scheme != "http" && u.Scheme != "https":
		return "must be an http or https URL"
	case u.Host == "":
		return "has no host"
	case u.User != nil:
		return "must not hold a user or password: put the key in the variable api_key_env names, or a header in headers_from_env (the value is not shown)"
	}
	return ""
}

// looksLikeKey reports whether s, given where an environment variable
// name belongs, is more likely a secret pasted in: it starts like a
// well-known API key, holds a character no variable name can, or is long
// and random-looking (upper and lower case letters and digits mixed).
func looksLikeKey(s string) bool {
	for _, p := range keyPrefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	if strings.ContainsFunc(s, func(r rune) bool {
		return !(r == '_' || r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z')
	}) {
		return true
	}
	if len(s) < 20 {
		return false
	}
	lower := strings.ContainsFunc(s, unicode.IsLower)
	upper := strings.ContainsFunc(s, unicode.IsUpper)
	digit := strings.ContainsFunc(s, unicode.IsDigit)
	return lower && upper && digit || len(s) >= 32 && !strings.Contains(s, "_")
}

// EnvVars maps api_key_env and each headers_from_env.NAME to the variable
// it names: the variables the provider reads when it is built.
func (s Settings) EnvVars() map[string]string {
	out := map[string]string{}
	if s.APIKeyEnv != "" {
		out["api_key_env"] = s.APIKeyEnv
	}
	for k, v := range s.HeadersFromEnv {
		out["headers_from_env."+k] = v
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// AllHeaders returns Headers with the values of HeadersFromEnv read
// through getenv.
func (s Settings) AllHeaders(getenv func(string) string) map[string]string {
	if len(s.HeadersFromEnv) == 0 {
		return s.Headers
	}
	out := make(map[string]string, len(s.Headers)+len(s.HeadersFromEnv))
	for k, v := range s.Headers {
		out[k] = v
	}
	for k, env := range s.HeadersFromEnv {
		out[k] = getenv(env)
	}
	return out
}

// Secrets returns the values read through getenv or held in the file
// that must never be logged: the API key and every header value.
func (s Settings) Secrets(getenv func(string) string) []string {
	out := []string{s.APIKey(getenv)}
	for _, v := range s.AllHeaders(getenv) {
		out = append(out, v)
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// APIKey returns the key read through getenv from the variable APIKeyEnv
// names, or "" when it names none.
func (s Settings) APIKey(getenv func(string) string) string {
	if s.APIKeyEnv == "" {
		return ""
	}
	return getenv(s.APIKeyEnv)
}

// Entry is a providers entry of an HTTP adapter's type: the shared
// [Settings], and what the adapter adds to them — its type's name, whether
// it needs a key, and its constructor. Each adapter's DefaultSettings
// returns one; the registry lists it.
type Entry struct {
	Settings `yaml:",inline"`

	typ         string
	keyRequired bool
	build       func(Config) (llm.Provider, error)
}

// NewEntry returns the entry of adapter typ with the defaults of a block
// that sets nothing but its type ([Defaults] with baseURL); keyRequired
// says whether api_key_env must be set, and build makes the provider from
// its Config.
func NewEntry(typ, baseURL string, keyRequired bool, build func(Config) (llm.Provider, error)) *Entry {
	return &Entry{Settings: Defaults(baseURL), typ: typ, keyRequired: keyRequired, build: build}
}

// Problems lists every setting that is wrong, without looking at the
// environment; none when e is valid. Field is the setting's yaml key.
func (e *Entry) Problems() []llm.Problem { return e.Check(e.typ, e.keyRequired) }

// Build returns the provider named name, its API key and the headers of
// headers_from_env read through getenv from the variables they name.
func (e *Entry) Build(name string, getenv func(string) string) (llm.Provider, error) {
	return e.build(Config{Name: name, BaseURL: e.BaseURL, APIKey: e.APIKey(getenv), Headers: e.AllHeaders(getenv), ConnectTimeout: e.ConnectTimeout})
}

// Endpoint returns the base URL the provider's requests go to, for the
// model calls' telemetry (server.address and server.port).
func (s Settings) Endpoint() string { return s.BaseURL }
