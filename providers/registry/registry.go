// Package registry is the one list of provider types: for each type the
// configuration file can name, the settings its providers entries decode
// into, which know their defaults, their static checks, the environment
// variables they read and how to build the provider.
//
// Adding a provider type is a package under providers/ with a settings.go
// (a yaml-tagged Settings type with DefaultSettings, Problems, EnvVars
// and Build) and one line in [types].
//
// The package imports llm and the provider packages.
package registry

import (
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/anthropic"
	"github.com/turnstile-dev/turnstile/providers/gemini"
	"github.com/turnstile-dev/turnstile/providers/openai"
	"github.com/turnstile-dev/turnstile/providers/sim"
)

// types lists every provider type, one line each, in the order messages
// list them.
var types = []Type{
	typeOf("simulator", sim.DefaultSettings),
	typeOf("openai", openai.DefaultSettings),
	typeOf("anthropic", anthropic.DefaultSettings),
	typeOf("gemini", gemini.DefaultSettings),
}

// Settings is a providers entry of the configuration file, decoded into
// its type's settings: a pointer to a struct whose yaml tags are the
// entry's keys (all but type).
type Settings interface {
	// Problems lists every setting that is wrong, without looking at the
	// environment; Field is the key's path inside the entry. No message
	// quotes a value that may be secret.
	Problems() []llm.Problem
	// EnvVars maps the key of each setting that names an environment
	// variable to that variable: the variables Build reads, each of which
	// must be set and not empty.
	EnvVars() map[string]string
	// Build returns the provider named name, reading the variables of
	// EnvVars through getenv.
	Build(name string, getenv func(string) string) (llm.Provider, error)
}

// Type is one provider type.
type Type struct {
	// Name is the type as the file's type key spells it.
	Name string
	// New returns settings holding the type's defaults, ready to be
	// decoded into.
	New func() Settings
}

// typeOf makes the Type whose settings defaults returns.
func typeOf[S Settings](name string, defaults func() S) Type {
	return Type{Name: name, New: func() Settings { return defaults() }}
}

// Lookup returns the type called name.
func Lookup(name string) (Type, bool) {
	for _, t := range types {
		if t.Name == name {
			return t, true
		}
	}
	return Type{}, false
}

// Names returns the name of every type, in registration order.
func Names() []string {
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = t.Name
	}
	return names
}
