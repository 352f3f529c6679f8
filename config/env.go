package config

import (
	"net/url"
	"slices"
)

// ProvidersInUse splits the providers into those some model uses and
// those none does, each sorted by name. Only the providers in use are
// built, so only their environment variables are needed.
func (c *Config) ProvidersInUse() (used, unused []string) {
	inUse := map[string]bool{}
	for _, m := range c.Models {
		for _, d := range m.Routes() {
			inUse[d.Provider] = true
		}
	}
	for _, name := range sortedKeys(c.Providers) {
		if inUse[name] {
			used = append(used, name)
		} else {
			unused = append(unused, name)
		}
	}
	return used, unused
}

// CheckEnv reports, all at once as an [*Errors], every environment
// variable that a provider in use or a client key names but that lookup
// finds unset or empty, and client keys that share a token. Each problem
// names the variable and the key, never a value.
func (c *Config) CheckEnv(lookup func(name string) (string, bool)) error {
	v := &checker{c: c}
	used, _ := c.ProvidersInUse()
	for _, name := range used {
		s := c.Providers[name].Settings
		if s == nil {
			continue
		}
		vars := s.EnvVars()
		for _, key := range sortedKeys(vars) {
			switch val, ok := lookup(vars[key]); {
			case !ok:
				v.at("providers."+name+"."+key, "the environment variable %s is not set", vars[key])
			case val == "":
				v.at("providers."+name+"."+key, "the environment variable %s is empty", vars[key])
			}
		}
	}
	c.checkAuthEnv(v, lookup)
	return newErrors(c.file, v.out)
}

// secretHolder is implemented by provider settings that know which of
// their values are secret, in the file or in the environment.
type secretHolder interface {
	Secrets(getenv func(string) string) []string
}

// Secrets returns every secret value the configuration holds or names in
// the environment, for a last redaction of log lines: the providers' API
// keys and header values (of the providers in use), the MCP servers'
// header values, environment values, and URL credentials and query
// values, and the client keys' tokens. Values shorter than 8 bytes are
// left out: they are no real secrets, and redacting them would mangle
// words.
func (c *Config) Secrets(getenv func(string) string) []string {
	var out []string
	add := func(vs ...string) {
		for _, v := range vs {
			if len(v) >= 8 && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	used, _ := c.ProvidersInUse()
	for _, name := range used {
		switch s := c.Providers[name].Settings.(type) {
		case nil:
		case secretHolder:
			add(s.Secrets(getenv)...)
		default:
			for _, env := range s.EnvVars() {
				add(getenv(env))
			}
		}
	}
	for _, name := range sortedKeys(c.MCPServers) {
		s := c.MCPServers[name]
		for _, v := range s.Headers {
			add(v)
		}
		for _, env := range s.HeadersFromEnv {
			add(getenv(env))
		}
		for _, v := range s.Env {
			add(v)
		}
		for _, env := range s.EnvFrom {
			add(getenv(env))
		}
		if u, err := url.Parse(s.URL); err == nil && s.URL != "" {
			if u.User != nil {
				pw, _ := u.User.Password()
				add(u.User.Username(), pw)
			}
			add(u.RawQuery)
			for _, vs := range u.Query() {
				add(vs...)
			}
		}
	}
	for _, k := range c.Auth.Keys {
		if k.TokenEnv != "" {
			add(getenv(k.TokenEnv))
		}
	}
	return out
}
