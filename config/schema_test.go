package config

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// compileSchema compiles Schema(), with the draft's meta-schema checking
// it.
func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{})
	if err := c.AddResource(SchemaID, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(SchemaID)
	if err != nil {
		t.Fatalf("the schema does not compile: %v", err)
	}
	return s
}

// yamlInstance turns YAML into the JSON value the schema validates.
func yamlInstance(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// repoConfigs returns every configuration file of the repository by name:
// the deploy file, the clients' conformance servers, and the config
// compose.yaml embeds.
func repoConfigs(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	files, err := filepath.Glob("../clients/conformance/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, "../deploy/turnstile.yaml") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[f] = b
	}
	b, err := os.ReadFile("../deploy/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Configs map[string]struct {
			Content string `yaml:"content"`
		} `yaml:"configs"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	embedded := compose.Configs["turnstile"].Content
	if embedded == "" {
		t.Fatal("deploy/compose.yaml has no configs.turnstile.content")
	}
	out["../deploy/compose.yaml#configs.turnstile"] = []byte(embedded)
	return out
}

// TestRepoConfigs validates every configuration file of the repository
// against the schema and by the decoder's own checks, which must agree.
func TestRepoConfigs(t *testing.T) {
	s := compileSchema(t)
	for name, b := range repoConfigs(t) {
		t.Run(name, func(t *testing.T) {
			if err := s.Validate(yamlInstance(t, b)); err != nil {
				t.Errorf("schema: %v", err)
			}
			if _, err := Parse(name, b); err != nil {
				t.Errorf("Parse: %v", err)
			}
		})
	}
	// The files that stand alone name the schema, for editors, by a path
	// that leads to it from where they are.
	for name, b := range repoConfigs(t) {
		if strings.Contains(name, "#") {
			continue // a config inside another file
		}
		first, _, _ := strings.Cut(string(b), "\n")
		rel, ok := strings.CutPrefix(first, "# yaml-language-server: $schema=")
		if !ok {
			t.Errorf("%s does not start with a yaml-language-server $schema line", name)
			continue
		}
		if got := filepath.Join(filepath.Dir(name), rel); got != filepath.Clean("../config/turnstile.schema.json") {
			t.Errorf("%s names the schema %s, which leads to %s", name, rel, got)
		}
	}
}

// TestSchemaRejects checks that the schema catches the mistakes an editor
// should underline, as the decoder does, and takes what the decoder takes.
func TestSchemaRejects(t *testing.T) {
	s := compileSchema(t)
	tests := []struct {
		name, yaml string
		valid      bool
	}{
		{"defaults", "{}", true},
		{"zero duration", "retry: {initial_backoff: 0, max_backoff: 2s}", true},
		{"hedge quantile", "models: {m: {provider: p, model: x, hedge: {after: p95, to: self}}}", true},
		{"provider keys", "providers: {o: {type: openai, api_key_env: K, base_url: 'https://x/'}}", true},
		{"hedge left unset", "models: {m: {hedge: null}}", true},
		{"key limit", "auth: {keys: [{name: a, token_env: K, limits: {turns_per_minute: 5, stored_bytes: null}}]}", true},
		{"unknown key", "listne: 1", false},
		{"unknown nested key", "server: {max_turns: 1}", false},
		{"bad enum", "log: {level: loud}", false},
		{"bad stream cut", "models: {m: {on_stream_cut: resume}}", false},
		{"duration without unit", "turn: {tool_timeout: 30}", false},
		{"wrong type", "server: {reflection: yes please}", false},
		{"provider without type", "providers: {o: {base_url: x}}", false},
		{"unknown provider type", "providers: {o: {type: bedrock}}", false},
		{"key of another type", "providers: {s: {type: simulator, api_key_env: K}}", false},
		{"negative uint", "server: {max_concurrent_streams: -1}", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Validate(yamlInstance(t, []byte(tt.yaml)))
			if (err == nil) != tt.valid {
				t.Errorf("Validate(%s) = %v, want valid %v", tt.yaml, err, tt.valid)
			}
		})
	}
}
