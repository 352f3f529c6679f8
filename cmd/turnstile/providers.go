package main

import (
	"fmt"
	"os"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/providers/gemini"
	"github.com/turnstile-dev/turnstile/providers/sim"
	"github.com/turnstile-dev/turnstile/runtime"
)

// newProvider builds the provider a configuration entry describes. API
// keys come only from the environment variable the entry names.
func newProvider(name string, pc config.Provider) (runtime.Provider, error) {
	switch pc.Type {
	case "simulator":
		return sim.New(name, sim.Config{TokenDelay: pc.TokenDelay, Script: pc.Script})
	case "gemini":
		key, err := apiKey(pc, true)
		if err != nil {
			return nil, err
		}
		return gemini.New(gemini.Config{Name: name, BaseURL: pc.BaseURL, APIKey: key, Headers: pc.Headers, ConnectTimeout: pc.ConnectTimeout})
	}
	return nil, fmt.Errorf("type %q is not available in this build", pc.Type)
}

// apiKey reads the key from the variable pc.APIKeyEnv names. A provider
// that requires a key fails when the file names no variable or the
// variable is empty; the error names the variable, never a value.
func apiKey(pc config.Provider, required bool) (string, error) {
	if pc.APIKeyEnv == "" {
		if required {
			return "", fmt.Errorf("api_key_env: required for type %s", pc.Type)
		}
		return "", nil
	}
	key := os.Getenv(pc.APIKeyEnv)
	if key == "" && required {
		return "", fmt.Errorf("api_key_env: the environment variable %s is not set", pc.APIKeyEnv)
	}
	return key, nil
}
