package test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/turnstile-dev/turnstile/internal/livetest"
)

// secrets are the Secrets a test cluster holds, by name: their keys and
// values.
type secrets map[string]map[string][]byte

// testPKI makes a CA and two certificates it signed: the server's, for
// the Service's name (and 127.0.0.1, where the test reaches it), and a
// client's; as the Secrets the shapes name hold them.
func testPKI(t *testing.T, serviceName string) secrets {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	// The certificates' validity is wide around now, so that no clock
	// matters.
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
		k := key()
		tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = big.NewInt(serial), now.Add(-time.Hour), now.Add(24*time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvCert, srvKey := issue(2, &x509.Certificate{Subject: pkix.Name{CommonName: serviceName}, DNSNames: []string{serviceName},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	cliCert, cliKey := issue(3, &x509.Certificate{Subject: pkix.Name{CommonName: "helm test"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return secrets{
		// cert-manager's Secrets hold the CA as ca.crt beside the pair.
		"turnstile-tls":         {"tls.crt": srvCert, "tls.key": srvKey, "ca.crt": caPEM},
		"turnstile-client-ca":   {"ca.crt": caPEM},
		"turnstile-test-client": {"tls.crt": cliCert, "tls.key": cliKey},
	}
}

// pod is a container of a rendered pod as this test runs it without a
// cluster: its volumes made into directories, its mounts the prefixes
// rewritten to them, its environment resolved.
type pod struct {
	t      *testing.T
	mounts [][2]string // mount path -> directory, longest first
	env    []string
}

// mountPod makes each volume of spec that a container mounts into a
// directory: a Secret's keys (or its items), a ConfigMap's data, and an
// empty directory for the others (emptyDir, the store's claim); and
// resolves the container's environment from envFrom Secrets and env,
// expanding $(VAR) as the kubelet does.
func mountPod(t *testing.T, spec corev1.PodSpec, c corev1.Container, sec secrets, cms map[string]map[string]string) *pod {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	p := &pod{t: t}
	for _, m := range c.VolumeMounts {
		dir := t.TempDir()
		v := vols[m.Name]
		files := map[string][]byte{}
		switch {
		case v.Secret != nil:
			s, ok := sec[v.Secret.SecretName]
			if !ok {
				t.Fatalf("volume %s: no Secret %s in the test cluster", m.Name, v.Secret.SecretName)
			}
			if len(v.Secret.Items) == 0 {
				files = s
			}
			for _, it := range v.Secret.Items {
				b, ok := s[it.Key]
				if !ok {
					t.Fatalf("volume %s: Secret %s has no key %s", m.Name, v.Secret.SecretName, it.Key)
				}
				files[it.Path] = b
			}
		case v.ConfigMap != nil:
			for k, val := range cms[v.ConfigMap.Name] {
				files[k] = []byte(val)
			}
		case v.EmptyDir != nil || m.Name == "store":
		default:
			t.Fatalf("volume %s: %+v, which the test cannot make", m.Name, v)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		p.mounts = append(p.mounts, [2]string{m.MountPath, dir})
	}
	slices.SortFunc(p.mounts, func(a, b [2]string) int { return len(b[0]) - len(a[0]) })

	vars := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.SecretRef == nil {
			t.Fatalf("envFrom %+v: only Secrets", from)
		}
		s, ok := sec[from.SecretRef.Name]
		if !ok {
			t.Fatalf("envFrom: no Secret %s in the test cluster", from.SecretRef.Name)
		}
		for k, v := range s {
			vars[k] = string(v)
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Fatalf("env %s: valueFrom, which the test does not resolve", e.Name)
		}
		vars[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string {
			if v, ok := vars[m[2:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	for k, v := range vars {
		p.env = append(p.env, k+"="+v)
	}
	return p
}

// path returns where the pod's path is on this machine.
func (p *pod) path(s string) string {
	for _, m := range p.mounts {
		if s == m[0] || strings.HasPrefix(s, m[0]+"/") {
			return m[1] + strings.TrimPrefix(s, m[0])
		}
	}
	return s
}

// TestHelmTestRunsATurn runs the hook `helm test` runs, for the chart's
// defaults and each shape that renders one on the simulator: the rendered server configuration is served by a real
// `turnstile serve` (its files where the pod mounts them, its store on a
// temporary directory, its listeners on 127.0.0.1), and the test Pod's
// command, with its rendered arguments, mounts and environment, runs
// `turnstile run` against it, over TLS and with the client key where the
// shape asks. The Pod's address is the Service's name, which the test
// reaches at 127.0.0.1; everything else is as rendered.
func TestHelmTestRunsATurn(t *testing.T) {
	bin := livetest.Binary(t, "../../..")
	chart := chartCopy(t)
	ran := 0
	for _, f := range append([]string{""}, shapes(t)...) {
		name, args := "defaults", []string(nil)
		if f != "" {
			name, args = filepath.Base(f), []string{"-f", f}
		}
		t.Run(name, func(t *testing.T) {
			objs := render(t, chart, args...)
			pods := find[corev1.Pod](objs)
			if len(pods) == 0 {
				return
			}
			if len(pods) != 1 {
				t.Fatalf("%d test Pods", len(pods))
			}
			tp := pods[0]
			if tp.Annotations["helm.sh/hook"] != "test" || tp.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("test Pod: hook %q, restartPolicy %q; want a test hook that runs once", tp.Annotations["helm.sh/hook"], tp.Spec.RestartPolicy)
			}
			var model string
			for _, a := range tp.Spec.Containers[0].Args {
				if m, ok := strings.CutPrefix(a, "--model="); ok {
					model = m
				}
			}
			if model != "sim" {
				// A turn on a real provider: rendered and decoded, not run.
				return
			}
			ran++
			service := release + "-turnstile." + namespace + ".svc"
			sec := testPKI(t, service)
			token := "helm-test-token"
			sec["turnstile-keys"] = map[string][]byte{"TURNSTILE_KEY": []byte(token)}
			cms := map[string]map[string]string{}
			for _, cm := range find[corev1.ConfigMap](objs) {
				cms[cm.Name] = cm.Data
			}

			// The server, as the workload runs it.
			spec, c := workloadPod(t, objs)
			srv := mountPod(t, spec, c, sec, cms)
			var cfg map[string]any
			cfgPath := ""
			for _, e := range c.Env {
				if e.Name == "TURNSTILE_CONFIG" {
					cfgPath = srv.path(e.Value)
				}
			}
			b, err := os.ReadFile(cfgPath)
			if err != nil {
				t.Fatalf("the configuration the workload names: %v", err)
			}
			if err := yaml.Unmarshal(b, &cfg); err != nil {
				t.Fatal(err)
			}
			cfg["listen"] = "127.0.0.1:0"
			cfg["ops"] = map[string]any{"listen": "127.0.0.1:0"}
			relocate(cfg, srv.path)
			b, err = yaml.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			local := filepath.Join(t.TempDir(), "turnstile.yaml")
			if err := os.WriteFile(local, b, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, kv := range srv.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			addr := livetest.Serve(t, "../../..", local)
			_, port, _ := net.SplitHostPort(addr)

			// The test Pod's command.
			cli := mountPod(t, tp.Spec, tp.Spec.Containers[0], sec, cms)
			var args []string
			for _, a := range tp.Spec.Containers[0].Args {
				switch {
				case strings.HasPrefix(a, "--addr="):
					if want := "--addr=" + service + ":7700"; a != want {
						t.Errorf("test Pod: %s, want %s (the Service)", a, want)
					}
					a = "--addr=127.0.0.1:" + port
				case strings.HasPrefix(a, "--"):
					if k, v, ok := strings.Cut(a, "="); ok {
						a = k + "=" + cli.path(v)
					}
				}
				args = append(args, a)
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = cli.env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("turnstile %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
			}
			if strings.TrimSpace(stdout.String()) == "" {
				t.Errorf("turnstile %s printed no reply (stderr: %s)", strings.Join(args, " "), stderr.String())
			}
		})
	}
	if ran == 0 {
		t.Fatal("no shape renders a test Pod on the simulator: nothing was run")
	}
}

// workloadPod returns the pod template and container of the rendered
// StatefulSet or Deployment.
func workloadPod(t *testing.T, objs []object) (corev1.PodSpec, corev1.Container) {
	t.Helper()
	for _, o := range objs {
		switch w := o.obj.(type) {
		case *appsv1.StatefulSet:
			return w.Spec.Template.Spec, w.Spec.Template.Spec.Containers[0]
		case *appsv1.Deployment:
			return w.Spec.Template.Spec, w.Spec.Template.Spec.Containers[0]
		}
	}
	t.Fatal("no workload rendered")
	return corev1.PodSpec{}, corev1.Container{}
}

// relocate rewrites every absolute path among the string values of v with
// path.
func relocate(v any, path func(string) string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && strings.HasPrefix(s, "/") {
				v[k] = path(s)
			} else {
				relocate(x, path)
			}
		}
	case []any:
		for _, x := range v {
			relocate(x, path)
		}
	}
}
