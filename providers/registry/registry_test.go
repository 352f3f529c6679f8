package registry

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestTypes checks what config relies on for every registered type: the
// settings are a fresh pointer to a struct, their defaults pass their own
// checks but for a required key, and with a key they build a provider.
func TestTypes(t *testing.T) {
	if got, want := Names(), []string{"simulator", "openai", "anthropic", "gemini"}; !slices.Equal(got, want) {
		t.Errorf("Names = %v, want %v", got, want)
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			typ, ok := Lookup(name)
			if !ok || typ.Name != name {
				t.Fatalf("Lookup(%q) = %v, %v", name, typ, ok)
			}
			s := typ.New()
			v := reflect.ValueOf(s)
			if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
				t.Fatalf("settings are a %T, want a pointer to a struct", s)
			}
			if typ.New() == s {
				t.Error("New returns the same settings twice")
			}
			for _, p := range s.Problems() {
				if p.Field != "api_key_env" || !strings.HasPrefix(p.Message, "required") {
					t.Errorf("defaults: %s: %s", p.Field, p.Message)
				}
				reflect.ValueOf(s).Elem().FieldByName("APIKeyEnv").SetString("TEST_KEY")
			}
			if p := s.Problems(); len(p) > 0 {
				t.Errorf("defaults with a key: %v", p)
			}
			for _, v := range s.EnvVars() {
				if v != "TEST_KEY" {
					t.Errorf("EnvVars names %s", v)
				}
			}
			p, err := s.Build("up", func(string) string { return "test-key" })
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			if p == nil {
				t.Fatal("Build returned no provider")
			}
		})
	}
	if _, ok := Lookup("bedrock"); ok {
		t.Error("Lookup(bedrock) found a type")
	}
}
