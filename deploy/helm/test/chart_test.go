package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsconf "github.com/nats-io/nats-server/v2/conf"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/turnstile-dev/turnstile/config"
)

const (
	chartDir  = "../turnstile"
	release   = "prod"
	namespace = "ai"
)

var (
	helmOnce sync.Once
	helmBin  string
	helmErr  error
)

// helm returns a helm binary: HELM_BIN, or one built from this module's
// pinned tool.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if helmBin = os.Getenv("HELM_BIN"); helmBin != "" {
			return
		}
		dir, err := os.MkdirTemp("", "helm-")
		if err != nil {
			helmErr = err
			return
		}
		helmBin = filepath.Join(dir, "helm")
		if out, err := exec.Command("go", "build", "-o", helmBin, "helm.sh/helm/v3/cmd/helm").CombinedOutput(); err != nil {
			helmErr = fmt.Errorf("go build helm: %v\n%s", err, out)
		}
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmBin
}

// chartCopy copies the chart as a fresh clone has it (the tracked files
// only: nothing a local helm dependency build left), into a directory of
// its own.
func chartCopy(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "turnstile")
	files, err := exec.Command("git", "ls-files", "--", chartDir).Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	n := 0
	for f := range strings.Lines(string(files)) {
		f = strings.TrimSpace(f)
		rel, err := filepath.Rel(chartDir, f)
		if err != nil || f == "" {
			t.Fatalf("git ls-files: %q: %v", f, err)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n < 5 {
		t.Fatalf("git ls-files %s: %d files", chartDir, n)
	}
	return dst
}

// helmCmd is a helm command that cannot reach the network nor read the
// user's helm settings: its home directories are empty ones of the test,
// and every proxy variable names a port nothing listens on, so a chart
// that needed a download would fail here.
func helmCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"HTTP_PROXY=http://127.0.0.1:9", "HTTPS_PROXY=http://127.0.0.1:9", "NO_PROXY=",
		"http_proxy=http://127.0.0.1:9", "https_proxy=http://127.0.0.1:9", "no_proxy=")
	return cmd
}

// shapes are the values files of the shapes docs/deployment.md shows.
func shapes(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("ci/*-values.yaml: %v, %v; want the four shapes", files, err)
	}
	return files
}

func TestLint(t *testing.T) {
	chart := chartCopy(t)
	for _, f := range shapes(t) {
		out, err := helmCmd(t, "lint", "--strict", chart, "-f", f).CombinedOutput()
		if err != nil {
			t.Errorf("helm lint --strict -f %s: %v\n%s", filepath.Base(f), err, out)
		}
	}
}

// object is one rendered object, decoded into its k8s.io/api type.
type object struct {
	kind, name string
	obj        any
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor
// the chart renders (its types are not in k8s.io/api).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// render runs helm template with the values files and decodes every
// object strictly: a field the API type does not have fails.
func render(t *testing.T, chart string, args ...string) []object {
	t.Helper()
	cmd := helmCmd(t, append([]string{"template", release, chart, "--namespace", namespace}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr.String())
	}
	var objs []object
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(j, &tm); err != nil {
			t.Fatal(err)
		}
		var into any
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/ConfigMap":
			into = &corev1.ConfigMap{}
		case "v1/Pod":
			into = &corev1.Pod{}
		case "v1/Secret":
			into = &corev1.Secret{}
		case "v1/Service":
			into = &corev1.Service{}
		case "v1/ServiceAccount":
			into = &corev1.ServiceAccount{}
		case "apps/v1/Deployment":
			into = &appsv1.Deployment{}
		case "apps/v1/StatefulSet":
			into = &appsv1.StatefulSet{}
		case "policy/v1/PodDisruptionBudget":
			into = &policyv1.PodDisruptionBudget{}
		case "autoscaling/v2/HorizontalPodAutoscaler":
			into = &autoscalingv2.HorizontalPodAutoscaler{}
		case "networking.k8s.io/v1/NetworkPolicy":
			into = &networkingv1.NetworkPolicy{}
		case "monitoring.coreos.com/v1/ServiceMonitor":
			into = &serviceMonitor{}
		default:
			t.Fatalf("rendered %s %s, which the test does not know", tm.APIVersion, tm.Kind)
		}
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); err != nil {
			t.Fatalf("%s: %v\n%s", tm.Kind, err, doc)
		}
		var meta struct{ Metadata metav1.ObjectMeta }
		_ = json.Unmarshal(j, &meta)
		objs = append(objs, object{tm.Kind, meta.Metadata.Name, into})
	}
	return objs
}

func find[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.obj.(*T); ok {
			out = append(out, *v)
		}
	}
	return out
}

// serverProbePaths reads the probe paths cmd/turnstile serves
// (livePath, readyPath in health.go).
func serverProbePaths(t *testing.T) (live, ready string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../../cmd/turnstile/health.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Values) == 1 {
			if lit, ok := vs.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				consts[vs.Names[0].Name], _ = strconv.Unquote(lit.Value)
			}
		}
		return true
	})
	if consts["livePath"] == "" || consts["readyPath"] == "" {
		t.Fatalf("cmd/turnstile/health.go: no livePath/readyPath constants (%v)", consts)
	}
	return consts["livePath"], consts["readyPath"]
}

// serverMemoryShare reads the share of the container's memory limit serve
// gives the heap when GOMEMLIMIT is unset (memoryLimitShare in
// cmd/turnstile/gc.go), and fails unless it leaves headroom.
func serverMemoryShare(t *testing.T) float64 {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../../cmd/turnstile/gc.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	share := -1.0
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok && len(vs.Values) == 1 && vs.Names[0].Name == "memoryLimitShare" {
			if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
				share, _ = strconv.ParseFloat(lit.Value, 64)
			}
		}
		return true
	})
	if share <= 0 || share >= 1 {
		t.Fatalf("cmd/turnstile/gc.go: memoryLimitShare %v, want a share below 1", share)
	}
	return share
}

func port(t *testing.T, hostport string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// TestShapes renders each shape and holds it to the server: the
// configuration parses, the pod's ports are the ones it listens on, the
// probes ask the ops listener's health paths, the grace period covers the
// drain, the shutdown grace and the hand-off with a margin, and the pod
// runs as non-root on a read-only root filesystem with the store on a
// volume.
func TestShapes(t *testing.T) {
	chart := chartCopy(t)
	live, ready := serverProbePaths(t)
	for _, f := range shapes(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			objs := render(t, chart, "-f", f)
			cms := find[corev1.ConfigMap](objs)
			if len(cms) != 1 {
				t.Fatalf("%d ConfigMaps, want 1", len(cms))
			}
			cfg, err := config.Parse("turnstile.yaml", []byte(cms[0].Data["turnstile.yaml"]))
			if err != nil {
				t.Fatalf("the rendered configuration: %v\n%s", err, cms[0].Data["turnstile.yaml"])
			}

			// The simulator only where the shape asks for it: a shape with
			// models of its own serves them alone.
			var shape struct {
				Config struct{ Models map[string]any }
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(b, &shape); err != nil {
				t.Fatal(err)
			}
			if sims := simulators(cfg); len(shape.Config.Models) > 0 && len(sims) > 0 {
				t.Errorf("a shape with models of its own serves the simulator (providers %v)", sims)
			}

			var pod corev1.PodTemplateSpec
			var replicas *int32
			sts, deps := find[appsv1.StatefulSet](objs), find[appsv1.Deployment](objs)
			switch {
			case len(sts) == 1 && len(deps) == 0:
				pod, replicas = sts[0].Spec.Template, sts[0].Spec.Replicas
				if cfg.Store.Mode != "embedded" {
					t.Errorf("a StatefulSet for store.mode %q", cfg.Store.Mode)
				}
				if len(sts[0].Spec.VolumeClaimTemplates) != 1 {
					t.Fatal("the embedded store's StatefulSet has no volumeClaimTemplate")
				}
				if replicas == nil || *replicas != 1 {
					t.Errorf("embedded store: replicas %v, want 1", replicas)
				}
			case len(deps) == 1 && len(sts) == 0:
				pod, replicas = deps[0].Spec.Template, deps[0].Spec.Replicas
				if cfg.Store.Mode != "nats" {
					t.Errorf("a Deployment for store.mode %q", cfg.Store.Mode)
				}
			default:
				t.Fatalf("%d StatefulSets and %d Deployments, want one workload", len(sts), len(deps))
			}
			if len(pod.Spec.Containers) != 1 {
				t.Fatalf("%d containers", len(pod.Spec.Containers))
			}
			c := pod.Spec.Containers[0]

			// The configuration is the file the image reads.
			var cfgPath string
			for _, e := range c.Env {
				if e.Name == "TURNSTILE_CONFIG" {
					cfgPath = e.Value
				}
			}
			mounts := map[string]corev1.VolumeMount{}
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = m
			}
			vols := map[string]corev1.Volume{}
			for _, v := range pod.Spec.Volumes {
				vols[v.Name] = v
			}
			if m, ok := mounts["config"]; !ok || cfgPath != m.MountPath+"/turnstile.yaml" || vols["config"].ConfigMap == nil || vols["config"].ConfigMap.Name != cms[0].Name {
				t.Errorf("TURNSTILE_CONFIG %q is not the ConfigMap's turnstile.yaml as mounted (%+v)", cfgPath, m)
			}
			if len(c.Args) != 1 || c.Args[0] != "serve" {
				t.Errorf("args %q, want [serve]", c.Args)
			}

			// Ports.
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			if ports["grpc"] != port(t, cfg.Listen) || ports["ops"] != port(t, cfg.Ops.Listen) {
				t.Errorf("container ports %v; the server listens on %s (gRPC) and %s (ops)", ports, cfg.Listen, cfg.Ops.Listen)
			}

			// Probes on the ops listener's health paths.
			for _, p := range []struct {
				name  string
				probe *corev1.Probe
				path  string
			}{{"startup", c.StartupProbe, live}, {"liveness", c.LivenessProbe, live}, {"readiness", c.ReadinessProbe, ready}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("no %s httpGet probe", p.name)
					continue
				}
				if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "ops" || p.probe.HTTPGet.Scheme == corev1.URISchemeHTTPS {
					t.Errorf("%s probe %+v, want plaintext GET %s on port ops", p.name, p.probe.HTTPGet, p.path)
				}
			}

			// The grace period: drain, shutdown grace, the 5s hand-off
			// bound, and a margin.
			grace := pod.Spec.TerminationGracePeriodSeconds
			need := cfg.Server.DrainDelay + cfg.Server.ShutdownGrace + 5*time.Second
			if grace == nil {
				t.Error("no terminationGracePeriodSeconds")
			} else if time.Duration(*grace)*time.Second <= need {
				t.Errorf("terminationGracePeriodSeconds %d, want more than drain_delay + shutdown_grace + 5s = %v", *grace, need)
			}
			if cfg.Server.DrainDelay <= 0 {
				t.Error("server.drain_delay 0: the listener would close before endpoints are removed")
			}

			// Security.
			psc, sc := pod.Spec.SecurityContext, c.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("security contexts %+v, %+v: want non-root, read-only root filesystem, no privilege escalation", psc, sc)
			}
			if cfg.Store.Mode == "embedded" {
				m, ok := mounts["store"]
				if !ok || !strings.HasPrefix(cfg.Store.Dir, m.MountPath+"/") || m.ReadOnly {
					t.Errorf("store.dir %s is not on the store volume (%+v)", cfg.Store.Dir, m)
				}
			}
			// The heap's soft limit is the server's own share of the
			// container's limit, not the whole limit.
			for _, e := range c.Env {
				if e.Name == "GOMEMLIMIT" {
					t.Errorf("the chart sets GOMEMLIMIT (%+v): serve sets %v of the container's limit itself", e, serverMemoryShare(t))
				}
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want a CPU request and a memory limit", c.Resources)
			}
			if len(pod.Spec.TopologySpreadConstraints) == 0 {
				t.Error("no topology spread")
			}

			// Services: the gRPC port's appProtocol says what is on the
			// wire (TLS, or plaintext gRPC a mesh's sidecar may proxy as
			// HTTP/2), and a headless one.
			wantProtocol := "grpc"
			if cfg.Server.TLS != nil {
				wantProtocol = "tls"
			}
			var headless bool
			for _, s := range find[corev1.Service](objs) {
				var grpcPort *corev1.ServicePort
				for i := range s.Spec.Ports {
					if s.Spec.Ports[i].Name == "grpc" {
						grpcPort = &s.Spec.Ports[i]
					}
				}
				if grpcPort == nil || grpcPort.AppProtocol == nil || *grpcPort.AppProtocol != wantProtocol || grpcPort.TargetPort.String() != "grpc" {
					t.Errorf("Service %s: grpc port %+v, want appProtocol %s to the grpc port", s.Name, grpcPort, wantProtocol)
				}
				headless = headless || s.Spec.ClusterIP == corev1.ClusterIPNone
			}
			if !headless {
				t.Error("no headless Service for the clients' dns:/// target")
			}

			pdbs := find[policyv1.PodDisruptionBudget](objs)
			hpas := find[autoscalingv2.HorizontalPodAutoscaler](objs)
			multi := len(hpas) > 0 || (replicas != nil && *replicas > 1)
			if multi != (len(pdbs) == 1) {
				t.Errorf("%d PodDisruptionBudgets with %v replicas and %d HPAs: want one exactly when there can be more than one replica", len(pdbs), replicas, len(hpas))
			}

			if strings.Contains(f, "nats-chart") && cfg.Store.NATS.URL != natsChartURL {
				t.Errorf("store.nats.url %q, want the Service of the NATS chart's release %q, %s", cfg.Store.NATS.URL, natsRelease, natsChartURL)
			}
		})
	}
}

// simulators returns the names of the simulator providers of cfg.
func simulators(cfg *config.Config) []string {
	var out []string
	for name, p := range cfg.Providers {
		if p.Type == "simulator" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// renderedConfig renders the chart with args and parses its configuration.
func renderedConfig(t *testing.T, chart string, args ...string) *config.Config {
	t.Helper()
	cms := find[corev1.ConfigMap](render(t, chart, args...))
	if len(cms) != 1 {
		t.Fatalf("%d ConfigMaps, want 1", len(cms))
	}
	cfg, err := config.Parse("turnstile.yaml", []byte(cms[0].Data["turnstile.yaml"]))
	if err != nil {
		t.Fatalf("the rendered configuration: %v\n%s", err, cms[0].Data["turnstile.yaml"])
	}
	return cfg
}

// TestSimulatorOnlyWhenAsked: config replaces the chart's default rather
// than merging with an example, and the simulator is served only when the
// values ask for it (simulator on, or auto with no model of one's own).
func TestSimulatorOnlyWhenAsked(t *testing.T) {
	chart := chartCopy(t)
	own := []string{"--set-json", `config.providers={"openai":{"type":"openai","api_key_env":"OPENAI_API_KEY"}}`,
		"--set-json", `config.models={"fast":{"provider":"openai","model":"gpt-4.1-mini"}}`}
	for _, tc := range []struct {
		name       string
		args       []string
		sims       []string
		models     []string
		defaultMod string
	}{
		{"defaults", nil, []string{"sim"}, []string{"sim"}, "sim"},
		{"own models", own, nil, []string{"fast"}, "fast"},
		{"own models, simulator off", append(slices.Clone(own), "--set", "simulator=off"), nil, []string{"fast"}, "fast"},
		{"own models, simulator on", append(slices.Clone(own), "--set", "simulator=on", "--set", "config.default_model=fast"), []string{"sim"}, []string{"fast", "sim"}, "fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := renderedConfig(t, chart, tc.args...)
			if got := simulators(cfg); !slices.Equal(got, tc.sims) {
				t.Errorf("simulator providers %v, want %v", got, tc.sims)
			}
			var models []string
			for alias := range cfg.Models {
				models = append(models, alias)
			}
			slices.Sort(models)
			if !slices.Equal(models, tc.models) || cfg.DefaultModel != tc.defaultMod {
				t.Errorf("models %v (default %q), want %v (default %q)", models, cfg.DefaultModel, tc.models, tc.defaultMod)
			}
		})
	}
}

// TestChartDefaultsAreTheServers: the chart's shutdown values are the
// server's defaults, so a chart without overrides and a bare `turnstile
// serve` shut down alike.
func TestChartDefaultsAreTheServers(t *testing.T) {
	objs := render(t, chartCopy(t))
	cfg, err := config.Parse("turnstile.yaml", []byte(find[corev1.ConfigMap](objs)[0].Data["turnstile.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.DrainDelay != config.DefaultDrainDelay || cfg.Server.ShutdownGrace != config.DefaultShutdownGrace {
		t.Errorf("chart: drain_delay %v, shutdown_grace %v; server defaults %v, %v", cfg.Server.DrainDelay, cfg.Server.ShutdownGrace,
			config.DefaultDrainDelay, config.DefaultShutdownGrace)
	}
	if g := find[appsv1.StatefulSet](objs)[0].Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g > 30 {
		t.Errorf("default terminationGracePeriodSeconds %v: want at most Kubernetes' default 30", g)
	}
}

// TestRefusals: shapes that cannot work fail at render time.
func TestRefusals(t *testing.T) {
	chart := chartCopy(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "replicaCount=3"}, "store.mode embedded keeps one process's own log"},
		{[]string{"--set", "store.mode=nats"}, "store.mode nats needs store.nats.url"},
		{[]string{"--set", "store.mode=off"}, "at '/store/mode': value must be one of 'embedded', 'nats'"},
		{[]string{"--set", "simulator=off"}, "config.models is empty and simulator is off"},
		{[]string{"--set", "simulator=on", "--set", "config.models.sim.provider=x"}, "config.providers.sim or config.models.sim: the simulator's names"},
		// Every key the chart sets, each named with the value to set
		// instead, all in one message.
		{[]string{"--set", "config.listen=0.0.0.0:1", "--set", "config.ops.listen=x", "--set", "config.store.dir=/x",
			"--set", "config.server.tls.cert_file=x", "--set", "config.server.drain_delay=1s"},
			"config.listen is the chart's: set ports.grpc\nconfig.ops.listen is the chart's: set ports.ops\nconfig.server.drain_delay is the chart's: set server.drainDelaySeconds\n" +
				"config.server.tls is the chart's: set tls.secretName\nconfig.store.dir is the chart's"},
	} {
		out, err := helmCmd(t, append([]string{"template", release, chart}, tc.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("helm template %v: %v, %s; want it to fail with %q", tc.args, err, out, tc.want)
		}
	}
}

// natsRelease is the release name docs/deployment.md and nats-values.yaml
// give the NATS chart; the chart names its objects after the release when
// the release's name holds "nats" (its nats.fullname), so its client
// Service in turnstile's namespace is natsChartURL.
const (
	natsRelease  = "nats"
	natsChartURL = "nats://" + natsRelease + ":4222"
)

// natsChartKeys are the value keys of the official NATS chart that
// nats-values.yaml sets, as its values.yaml documents them (nats-io/k8s,
// helm/charts/nats/values.yaml, chart 2.14.2): config.cluster.{enabled,
// replicas}, config.jetstream.{enabled, fileStore.{enabled, pvc.{enabled,
// size}}}, and config.merge, whose keys are nats-server configuration.
var natsChartKeys = []string{
	"config.cluster.enabled",
	"config.cluster.replicas",
	"config.jetstream.enabled",
	"config.jetstream.fileStore.enabled",
	"config.jetstream.fileStore.pvc.enabled",
	"config.jetstream.fileStore.pvc.size",
	"config.merge",
}

func leaves(prefix string, v any, out *[]string) {
	m, ok := v.(map[string]any)
	if !ok || prefix == "config.merge" {
		*out = append(*out, prefix)
		return
	}
	for k, v := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		leaves(p, v, out)
	}
}

// TestNATSValues holds nats-values.yaml, the values docs/deployment.md
// passes to the NATS chart, to that chart's keys and to what turnstile
// needs of the cluster: JetStream on a file store, 3 servers, max_payload
// of at least 8 MiB (parsed as nats-server parses it); and the chart
// declares no dependency, so that it renders without a download.
func TestNATSValues(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "..", "nats-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	var got []string
	leaves("", values, &got)
	for _, k := range got {
		if !slices.Contains(natsChartKeys, k) {
			t.Errorf("nats-values.yaml: %s is not a key of the NATS chart", k)
		}
	}
	if !strings.Contains(string(b), "helm install "+natsRelease+" nats/nats --version 2.14.2 -f deploy/helm/nats-values.yaml") {
		t.Errorf("nats-values.yaml does not say how to install it as the release %q", natsRelease)
	}
	get := func(path string) any {
		var v any = values
		for _, k := range strings.Split(path, ".") {
			m, _ := v.(map[string]any)
			v = m[k]
		}
		return v
	}
	if get("config.jetstream.enabled") != true || get("config.jetstream.fileStore.enabled") != true || get("config.cluster.enabled") != true {
		t.Error("the NATS chart's JetStream (file store) and cluster must be on")
	}
	if r, _ := get("config.cluster.replicas").(float64); r != 3 {
		t.Errorf("config.cluster.replicas %v, want 3", get("config.cluster.replicas"))
	}
	// The NATS chart writes a string "<< x >>" unquoted into nats.conf.
	mp, _ := get("config.merge.max_payload").(string)
	raw, ok := strings.CutPrefix(strings.TrimSpace(mp), "<<")
	raw, ok2 := strings.CutSuffix(raw, ">>")
	if !ok || !ok2 {
		t.Fatalf("config.merge.max_payload %q: want << size >>, which the NATS chart writes unquoted", mp)
	}
	conf, err := natsconf.Parse("max_payload: " + strings.TrimSpace(raw))
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	if n, _ := conf["max_payload"].(int64); n < 8<<20 {
		t.Errorf("max_payload %v, want at least 8 MiB", conf["max_payload"])
	}

	b, err = os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := yaml.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	if deps, ok := meta["dependencies"]; ok {
		t.Errorf("Chart.yaml declares dependencies %v: helm refuses to render the chart until they are downloaded", deps)
	}
}
