package main

import (
	"fmt"

	"github.com/turnstile-dev/turnstile/config"
	"github.com/turnstile-dev/turnstile/providers/sim"
	"github.com/turnstile-dev/turnstile/runtime"
)

// newProvider builds the provider a configuration entry describes.
func newProvider(name string, pc config.Provider) (runtime.Provider, error) {
	switch pc.Type {
	case "simulator":
		return sim.New(name, sim.Config{TokenDelay: pc.TokenDelay, Script: pc.Script})
	}
	return nil, fmt.Errorf("type %q is not available in this build", pc.Type)
}
