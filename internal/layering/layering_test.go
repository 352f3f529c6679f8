package layering

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/turnstile-dev/turnstile/"

// floors says, for each package of the module (matched by prefix, the
// longest match wins), which of the module's packages it may import
// directly. The order follows ARCHITECTURE.md, bottom floor first.
var floors = []struct {
	pkg   string
	may   []string
	notes string
}{
	{"llm", nil, "the vocabulary: the standard library only"},
	{"policy", []string{"llm"}, "the retry decision and per-model health"},
	{"runtime", []string{"llm", "policy", "internal/tick"}, "the turn loop"},
	{"providers/internal/", []string{"llm", "providers/internal/"}, "what the adapters share"},
	{"providers/registry", []string{"llm", "policy", "providers/"}, "one line per provider type"},
	{"providers/", []string{"llm", "providers/internal/"}, "an adapter: its SDK and the vocabulary, no other adapter"},
	{"tools/", []string{"llm", "tools/"}, "server-side tools"},
	{"gen/", nil, "generated code"},
	{"server", []string{"gen/", "llm", "policy", "runtime", "server/"}, "the gRPC face of the runtime and of the packages under it; never names a provider or a tool"},
	{"server/wire", []string{"gen/", "llm", "runtime"}, "the contract <-> runtime conversion, both ways, and the validation that belongs to the wire; no gRPC, no store"},
	{"server/durable", []string{"gen/", "llm", "policy", "runtime", "server/wire", "server/delivery", "server/admission"}, "durable runs: create, attach, own, watch, takeover, hand-off, signals; Go errors, no gRPC, no store (its TurnStore interface)"},
	{"server/delivery", []string{"gen/", "llm", "runtime", "server/wire"}, "one way to send a turn's events to a stream, one stall watchdog; no store, no keys"},
	{"server/guard", nil, "the connection guard below gRPC and the RPCs' sampled log lines; nothing of the module"},
	{"server/admission", []string{"llm", "policy", "runtime"}, "client keys, limits, budgets and their sharing across replicas; refusals are errors, no gRPC, no wire"},
	{"store", []string{"llm", "internal/tick"}, "the turn log on NATS JetStream: bytes, leases, control signals; no wire form"},
	{"client", []string{"gen/"}, "the Go client: the contract over gRPC and nothing of the server"},
	{"config", []string{"llm", "policy", "runtime", "providers/registry", "server", "store"}, "the file's shape; no wire"},
	{"telemetry", []string{"llm", "policy", "runtime"}, "traces, metrics and the turn's log line, as observers"},
	{"internal/fake", []string{"llm"}, "scripted upstreams for tests"},
	{"internal/wiretest", []string{"gen/"}, "wire helpers for tests"},
	{"internal/natstest", nil, "NATS servers for tests"},
	{"internal/bench", []string{"gen/"}, "the benchmark: the server as a child process, over the wire"},
	{"internal/livetest", nil, "starts turnstile serve for tests over the wire"},
	{"internal/layering", nil, "this test"},
	{"internal/tick", nil, "the process's clock of shared ticks that paced writes (a reply's text, a lease's renewal) wait for: the standard library only"},
	{"internal/memprobe", []string{"gen/"}, "a measurement command run by hand: a real server process and its clients"},
	{"internal/pages", nil, "a measurement command run by hand: which of a process's executable pages are resident"},
	{"internal/retained", []string{"store"}, "a measurement command run by hand: the embedded store's memory per retained turn, through the store's API"},
	{"examples/", []string{"client", "gen/"}, "runnable examples: the clients' public API only"},
	{"cmd/", []string{""}, "wiring: may import anything"},
}

// external lists, for the floors that must stay free of them, module paths
// no package of the floor may depend on, even indirectly.
var external = map[string][]string{
	"llm":     {"google.golang.org/", "github.com/"},
	"policy":  {"google.golang.org/", "github.com/"},
	"runtime": {"google.golang.org/", "github.com/"},
	// The conversion knows the contract's messages, not where they are
	// kept (the generated code brings gRPC's stubs, so gRPC cannot be
	// listed here; the table above keeps the server out).
	"server/wire": {"github.com/nats-io/"},
	// Durable runs know the store by their own interface only.
	"server/durable": {"github.com/grpc-ecosystem/", "github.com/nats-io/"},
	// Admission decides and charges; the gRPC face says it on the wire.
	"server/admission": {"google.golang.org/", "github.com/"},
	// The client imports no OpenTelemetry: a program that traces adds
	// otelgrpc's stats handler itself (client's package doc).
	"client": {mod + "runtime", mod + "server", mod + "providers", mod + "config", mod + "tools", "go.opentelemetry.io/"},
}

func rule(pkg string) (may []string, ok bool) {
	best := -1
	for i, f := range floors {
		if (pkg == f.pkg || strings.HasPrefix(pkg, strings.TrimSuffix(f.pkg, "/")+"/")) && (best < 0 || len(f.pkg) > len(floors[best].pkg)) {
			best = i
		}
	}
	if best < 0 {
		return nil, false
	}
	return floors[best].may, true
}

func goList(t *testing.T, format string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", format, "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestFloors fails on a direct import between the module's packages that
// the floors table does not allow, and on a package the table does not
// place.
func TestFloors(t *testing.T) {
	for _, line := range goList(t, `{{.ImportPath}} {{join .Imports " "}}`) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		may, ok := rule(pkg)
		if !ok {
			t.Errorf("package %s is on no floor: add it to the table and to ARCHITECTURE.md", pkg)
			continue
		}
	imports:
		for _, imp := range fields[1:] {
			dep, ours := strings.CutPrefix(imp, mod)
			if !ours {
				continue
			}
			for _, m := range may {
				if dep == m || strings.HasPrefix(dep, m) && (m == "" || strings.HasSuffix(m, "/")) || strings.HasPrefix(dep, m+"/") {
					continue imports
				}
			}
			t.Errorf("%s imports %s, which its floor does not allow", pkg, dep)
		}
	}
}

// TestFloorsStayLight fails when a low floor depends, even indirectly, on
// what it must stay free of (gRPC, protobuf, an SDK, the server side).
func TestFloorsStayLight(t *testing.T) {
	for _, line := range goList(t, `{{.ImportPath}} {{join .Deps " "}}`) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		for _, bad := range external[pkg] {
			for _, dep := range fields[1:] {
				if strings.HasPrefix(dep, bad) && !(strings.HasPrefix(dep, mod) && allowedOwn(pkg, dep)) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}

// allowedOwn reports whether dep, one of the module's packages, is a floor
// pkg may stand on: one it may import, or one a floor it may import may
// stand on (runtime's internal/tick under everything built on runtime).
func allowedOwn(pkg, dep string) bool {
	may, _ := rule(pkg)
	dep = strings.TrimPrefix(dep, mod)
	for _, m := range may {
		if dep == m || strings.HasPrefix(dep, m+"/") {
			return true
		}
	}
	for _, m := range may {
		if m != "" && !strings.HasSuffix(m, "/") && m != pkg && allowedOwn(m, mod+dep) {
			return true
		}
	}
	return false
}

// direct lists, for the packages under the gRPC face, the paths they must
// not import themselves: gRPC (its statuses, codes, streams, metadata)
// is the face's alone, which maps their errors to statuses. (The
// generated code they stand on imports gRPC for its stubs, so the check
// is of their own imports.)
var direct = map[string][]string{
	"server/wire":      {"google.golang.org/grpc", "github.com/grpc-ecosystem/"},
	"server/admission": {"google.golang.org/grpc", "github.com/grpc-ecosystem/"},
	"server/delivery":  {"google.golang.org/grpc", "github.com/grpc-ecosystem/"},
	"server/durable":   {"google.golang.org/grpc", "github.com/grpc-ecosystem/"},
}

// TestNoGRPCUnderTheFace fails when a package under the gRPC face imports
// gRPC itself.
func TestNoGRPCUnderTheFace(t *testing.T) {
	for _, line := range goList(t, `{{.ImportPath}} {{join .Imports " "}}`) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		for _, bad := range direct[pkg] {
			for _, imp := range fields[1:] {
				if imp == bad || strings.HasPrefix(imp, bad+"/") || strings.HasSuffix(bad, "/") && strings.HasPrefix(imp, bad) {
					t.Errorf("%s imports %s: gRPC is the face's (server)", pkg, imp)
				}
			}
		}
	}
}
