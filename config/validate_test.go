package config

import (
	"fmt"
	"testing"
)

// TestRequestsTheStoreCannotHold: with the turn store on (embedded, the
// default, or nats), a max_request_bytes or max_event_bytes larger than
// one store record takes is a problem at its YAML path, both at once;
// with the store off, or at the bounds, it is not.
func TestRequestsTheStoreCannotHold(t *testing.T) {
	const models = "providers: {sim: {type: simulator}}\nmodels: {m: {provider: sim, model: x}}\n"
	request := "config.yaml:3: server.max_request_bytes: must be at most 8323072 with the turn store on (store.mode %s): " +
		"a turn's request is stored whole in one record of at most 8388608 bytes; or set store.mode off"
	event := "config.yaml:3: server.max_event_bytes: must be at most 8323072 with the turn store on (store.mode %s): " +
		"each event is stored in one record of at most 8388608 bytes; or set store.mode off"
	tests := []struct {
		name, yaml, want string
	}{
		{"both over, embedded by default", models + "server: {max_request_bytes: 16777216, max_event_bytes: 8323073}\n",
			fmt.Sprintf(event, "embedded") + "\n" + fmt.Sprintf(request, "embedded")},
		{"a request over, on nats", models + "server: {max_request_bytes: 8323073}\nstore: {mode: nats, nats: {url: \"nats://127.0.0.1:4222\"}}\n",
			fmt.Sprintf(request, "nats")},
		{"at the bounds", models + "server: {max_request_bytes: 8323072, max_event_bytes: 8323072}\n", ""},
		{"store off", models + "server: {max_request_bytes: 16777216, max_event_bytes: 16777216}\nstore: {mode: off}\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("config.yaml", []byte(tt.yaml))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tt.want == "":
				if c.Server.MaxRequestBytes < 8323072 {
					t.Errorf("max_request_bytes %d", c.Server.MaxRequestBytes)
				}
			case err == nil || err.Error() != tt.want:
				t.Errorf("Parse error:\n%v\nwant:\n%s", err, tt.want)
			}
		})
	}
	if MaxStoredRequestBytes != 8323072 || MaxStoredEventBytes != 8323072 {
		t.Errorf("bounds %d and %d, documented as 8323072 and 8323072", MaxStoredRequestBytes, MaxStoredEventBytes)
	}
}
