package main

import (
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestModuleOf(t *testing.T) {
	t.Parallel()
	mods := []string{"github.com/nats-io/nats-server/v2", "github.com/turnstile-dev/turnstile", "github.com/nats-io/nats.go"}
	tests := []struct{ sym, want string }{
		{"github.com/nats-io/nats%2ego.(*Conn).readLoop", "github.com/nats-io/nats.go"},
		{"github.com/nats-io/nats%2ego/jetstream.(*kvs).Watch", "github.com/nats-io/nats.go"},
		{"github.com/nats-io/nats-server/v2/server.(*Server).Start", "github.com/nats-io/nats-server/v2"},
		{"type:.eq.github.com/turnstile-dev/turnstile/server.options", "github.com/turnstile-dev/turnstile"},
		{"github.com/turnstile-dev/turnstile/server.New.func1", "github.com/turnstile-dev/turnstile"},
		{"github.com/turnstile-dev/turnstile/server.run[go.shape.struct { X *github.com/nats-io/nats-server/v2/server.Server }]", "github.com/turnstile-dev/turnstile"},
		{"runtime.mallocgc", "runtime"},
		{"internal/runtime/maps.(*Map).getWithKey", "runtime"},
		{"net/http.(*conn).serve", "std"},
		{"main.main", "std"},
	}
	for _, tt := range tests {
		if got := moduleOf(tt.sym, mods); got != tt.want {
			t.Errorf("moduleOf(%q) = %q, want %q", tt.sym, got, tt.want)
		}
	}
}

// The test's own process: its code is running, so the page holding it is
// resident and counted in .text, and the windows add up.
func TestMeasureSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	r, err := measure(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	code := uint64(reflect.ValueOf(measure).Pointer())
	if !r.isResident(code) {
		t.Errorf("the page of measure's code (%#x) is not resident", code)
	}
	if r.sections[".text"] == 0 {
		t.Error("no resident .text")
	}
	for _, m := range r.mappings {
		if m.full > m.touched || uint64(m.touched)*window < uint64(len(m.resident))*pageSize/16 && m.touched == 0 {
			t.Errorf("mapping %#x-%#x: %d windows touched, %d all resident", m.start, m.end, m.touched, m.full)
		}
	}
	var own float64
	for m, b := range r.modules {
		if strings.HasPrefix(m, "github.com/turnstile-dev/turnstile") {
			own += b
		}
	}
	if own == 0 {
		t.Errorf(".text by module has nothing of this module: %v", r.modules)
	}
	if len(r.pcln) != 5 {
		t.Errorf("%d .gopclntab tables, want 5", len(r.pcln))
	}
}
