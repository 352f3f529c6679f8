package main

import (
	"fmt"
	"os"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/anthropic"
	"github.com/turnstile-dev/turnstile/providers/gemini"
	"github.com/turnstile-dev/turnstile/providers/openai"
	"github.com/turnstile-dev/turnstile/providers/sim"
)

// newProvider builds the provider a configuration entry describes. API
// keys come only from the environment variable the entry names.
func newProvider(name string, pc config.Provider) (llm.Provider, error) {
	switch pc.Type {
	case "simulator":
		return sim.New(name, sim.Config{TokenDelay: pc.TokenDelay, Script: pc.Script})
	case "openai":
		// Local OpenAI-compatible servers (Ollama, llama.cpp) need no key.
		key, err := apiKey(pc, false)
		if err != nil {
			return nil, err
		}
		return openai.New(openai.Config{Name: name, BaseURL: pc.BaseURL, APIKey: key, Headers: pc.Headers, ConnectTimeout: pc.ConnectTimeout})
	case "anthropic":
		key, err := apiKey(pc, true)
		if err != nil {
			return nil, err
		}
		return anthropic.New(anthropic.Config{Name: name, BaseURL: pc.BaseURL, APIKey: key, Headers: pc.Headers, ConnectTimeout: pc.ConnectTimeout})
	case "gemini":
		key, err := apiKey(pc, true)
		if err != nil {
			return nil, err
		}
		return gemini.New(gemini.Config{Name: name, BaseURL: pc.BaseURL, APIKey: key, Headers: pc.Headers, ConnectTimeout: pc.ConnectTimeout})
	}
	return nil, fmt.Errorf("type: unknown provider type %q", pc.Type)
}

// apiKey reads the key from the variable pc.APIKeyEnv names. A variable
// that is named but empty is an error, and so is naming none for a provider
// that requires a key; the error names the variable, never a value.
func apiKey(pc config.Provider, required bool) (string, error) {
	if pc.APIKeyEnv == "" {
		if required {
			return "", fmt.Errorf("api_key_env: required for type %s", pc.Type)
		}
		return "", nil
	}
	key := os.Getenv(pc.APIKeyEnv)
	if key == "" {
		return "", fmt.Errorf("api_key_env: the environment variable %s is not set", pc.APIKeyEnv)
	}
	return key, nil
}
