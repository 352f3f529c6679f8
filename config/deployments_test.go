package config

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// TestDeployments checks the two forms of a model's deployments, and
// that every problem of them is reported at once, at its YAML path.
func TestDeployments(t *testing.T) {
	const providers = "providers: {east: {type: simulator}, west: {type: simulator}}\n"
	tests := []struct {
		name string
		yaml string
		want []string     // the problems, in order; none: valid
		deps []Deployment // with want empty: what Routes returns
	}{{
		name: "single form",
		yaml: providers + "models: {chat: {provider: east, model: m1}}\n",
		deps: []Deployment{{Name: "east", Provider: "east", Model: "m1", Weight: 1}},
	}, {
		name: "deployments, weight and name defaulted",
		yaml: providers + "models:\n  chat:\n    deployments:\n      - {provider: east, model: m1, weight: 3}\n      - {name: w, provider: west, model: m2}\n",
		deps: []Deployment{{Name: "east", Provider: "east", Model: "m1", Weight: 3}, {Name: "w", Provider: "west", Model: "m2", Weight: 1}},
	}, {
		name: "one provider twice under two names",
		yaml: providers + "models:\n  chat:\n    deployments:\n      - {name: a, provider: east, model: m1}\n      - {name: b, provider: east, model: m1}\n",
		deps: []Deployment{{Name: "a", Provider: "east", Model: "m1", Weight: 1}, {Name: "b", Provider: "east", Model: "m1", Weight: 1}},
	}, {
		name: "both forms",
		yaml: providers + "models:\n  chat:\n    provider: east\n    model: m1\n    deployments:\n      - {provider: west, model: m2}\n",
		want: []string{
			"config.yaml:4: models.chat.provider: set provider and model, or deployments, not both: each deployment names its provider",
			"config.yaml:5: models.chat.model: set provider and model, or deployments, not both: each deployment names its model",
		},
	}, {
		name: "every problem of every entry",
		yaml: providers + "models:\n  chat:\n    deployments:\n      - {provider: east, model: m1, weight: 0}\n      - {provider: east, model: m2}\n      - {provider: north}\n      - {name: x, model: m3, weight: -2}\n",
		want: []string{
			"config.yaml:5: models.chat.deployments[0].weight: must be positive (default 1)",
			`config.yaml:6: models.chat.deployments[1].name: "east" is also the name of deployments[0]: names are unique per model (a deployment without one is named after its provider)`,
			"config.yaml:7: models.chat.deployments[2].model: required: the provider's model id",
			`config.yaml:7: models.chat.deployments[2].provider: "north" is not a configured provider`,
			"config.yaml:8: models.chat.deployments[3].provider: required: the name of an entry of providers",
			"config.yaml:8: models.chat.deployments[3].weight: must be positive (default 1)",
		},
	}, {
		name: "empty list",
		yaml: providers + "models:\n  chat:\n    deployments: []\n",
		want: []string{"config.yaml:4: models.chat.deployments: must not be empty: list the deployments, or set provider and model instead"},
	}, {
		name: "hedge to a deployment needs two",
		yaml: providers + "models:\n  chat:\n    provider: east\n    model: m1\n    hedge: {after: 1s, to: deployment}\n",
		want: []string{"config.yaml:6: models.chat.hedge.to: deployment needs a second entry in deployments to hedge to (or hedge to self)"},
	}, {
		name: "hedge to a deployment",
		yaml: providers + "models:\n  chat:\n    hedge: {after: 1s, to: deployment}\n    deployments:\n      - {provider: east, model: m1}\n      - {provider: west, model: m1}\n",
		deps: []Deployment{{Name: "east", Provider: "east", Model: "m1", Weight: 1}, {Name: "west", Provider: "west", Model: "m1", Weight: 1}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("config.yaml", []byte(tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if got := c.Models["chat"].Routes(); !reflect.DeepEqual(got, tt.deps) {
					t.Errorf("Routes() = %+v, want %+v", got, tt.deps)
				}
				return
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Parse error = %v, want an *Errors", err)
			}
			var got []string
			for _, p := range errs.Problems {
				got = append(got, fmt.Sprintf("config.yaml:%d: %s: %s", p.Line, p.Path, p.Message))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("problems:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestDeploymentsInUse checks that every deployment's provider is in use,
// so its environment variables are needed.
func TestDeploymentsInUse(t *testing.T) {
	c, err := Parse("config.yaml", []byte("providers: {east: {type: simulator}, west: {type: simulator}, idle: {type: simulator}}\nmodels:\n  chat:\n    deployments:\n      - {provider: east, model: m1}\n      - {provider: west, model: m1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	used, unused := c.ProvidersInUse()
	if !reflect.DeepEqual(used, []string{"east", "west"}) || !reflect.DeepEqual(unused, []string{"idle"}) {
		t.Errorf("ProvidersInUse() = %v, %v; want [east west], [idle]", used, unused)
	}
}
