package endpoint

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	c, err := Config{}.Resolve("openai", "https://api.example/v1/")
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "openai" || c.BaseURL != "https://api.example/v1/" || c.HTTPClient == nil {
		t.Errorf("Resolve(zero) = %+v, want the adapter's name, the default URL and a client", c)
	}
	own := &http.Client{}
	c, err = Config{Name: "local", BaseURL: "http://127.0.0.1:1/v1", HTTPClient: own}.Resolve("openai", "https://api.example/v1/")
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "local" || c.BaseURL != "http://127.0.0.1:1/v1" || c.HTTPClient != own {
		t.Errorf("Resolve(set) = %+v, want the caller's settings kept", c)
	}
	if _, err := (Config{ConnectTimeout: -time.Second}).Resolve("gemini", "x"); err == nil || err.Error() != "gemini: negative connect timeout" {
		t.Errorf("Resolve(negative timeout) error = %v", err)
	}
}

// A fake Stainless option package: each option records what it sets.
type (
	option     string
	httpClient interface {
		Do(*http.Request) (*http.Response, error)
	}
)

func withBaseURL(u string) option      { return option("base " + u) }
func withHTTPClient(httpClient) option { return "client" }
func withMaxRetries(n int) option      { return option("retries " + strconv.Itoa(n)) }
func withAPIKey(k string) option       { return option("key " + k) }
func withHeader(k, v string) option    { return option("header " + k + "=" + v) }

// stainless calls Stainless with the fake option package.
func stainless(c Config) (Config, []option, error) {
	return Stainless(c, "anthropic", "https://api.example/", withBaseURL, withHTTPClient, withMaxRetries, withAPIKey, withHeader)
}

func TestStainless(t *testing.T) {
	t.Parallel()
	c, opts, err := stainless(Config{APIKey: "k", Headers: map[string]string{"X-Team": "search"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []option{"base https://api.example/", "client", "retries 0", "key k", "header X-Team=search"}
	if diff := cmp.Diff(want, opts); diff != "" || c.Name != "anthropic" {
		t.Errorf("options (-want +got):\n%s\nname %q", diff, c.Name)
	}
	// Without a key no key option is sent: local servers take none.
	_, opts, err = stainless(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]option{"base https://api.example/", "client", "retries 0"}, opts); diff != "" {
		t.Errorf("options without a key (-want +got):\n%s", diff)
	}
	if _, _, err := stainless(Config{ConnectTimeout: -1}); err == nil {
		t.Error("a negative connect timeout was accepted")
	}
}
