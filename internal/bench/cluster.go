package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// NATSNodeFlag is the flag of `turnstile bench` that runs one NATS server
// of the bench's cluster shape, with the configuration file it names, in
// a process of its own (so that its CPU time is its own): the bench
// starts its own executable so ([Config.NATSBinary]).
const NATSNodeFlag = "--nats-node"

// RunNATSNode runs a NATS server with the configuration file path (the
// nats-server format) until ctx is done: one node of the bench's cluster
// shape.
func RunNATSNode(ctx context.Context, path string) error {
	opts, err := natsserver.ProcessConfigFile(path)
	if err != nil {
		return fmt.Errorf("nats node: %w", err)
	}
	opts.NoSigs = true
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats node: %w", err)
	}
	ns.Start()
	<-ctx.Done()
	ns.Shutdown()
	ns.WaitForShutdown()
	return nil
}

// natsNode is one NATS server of the cluster shape, run as a child
// process.
type natsNode struct {
	name    string
	cmd     *exec.Cmd
	url     string // its client URL
	monitor string // its monitoring listener's address
	prof    string // its profiling listener's address, empty without
	dir     string
	stderr  *bytes.Buffer
	done    chan struct{}
}

// startCluster starts n NATS servers with JetStream, clustered, on
// loopback ports, each a process running bin with [NATSNodeFlag], and
// waits until each answers its health check. Their files are under dir.
// With profile each serves Go's profiles on a port of its own
// (nats-server's prof_port).
func startCluster(ctx context.Context, bin, dir string, n int, profile bool) ([]*natsNode, error) {
	ports := make([]string, 4*n) // client, cluster, monitoring, profiling
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("%q", "nats://"+ports[n+i])
	}
	var nodes []*natsNode
	stopAll := func() {
		for _, nd := range nodes {
			nd.stop()
		}
	}
	for i := range n {
		nd := &natsNode{
			name: fmt.Sprintf("n%d", i), url: "nats://" + ports[i], monitor: ports[2*n+i],
			dir: filepath.Join(dir, fmt.Sprintf("n%d", i)), stderr: &bytes.Buffer{}, done: make(chan struct{}),
		}
		if err := os.MkdirAll(nd.dir, 0o700); err != nil {
			stopAll()
			return nil, err
		}
		// The servers' payloads are as large as the embedded store's, so
		// the replicas' records hold what a turn stores.
		conf := fmt.Sprintf(`server_name: %s
listen: %q
http: %q
max_payload: 8MB
jetstream { store_dir: %q }
cluster {
  name: turnstile-bench
  listen: %q
  routes: [%s]
}
`, nd.name, ports[i], nd.monitor, filepath.Join(nd.dir, "js"), ports[n+i], strings.Join(routes, ", "))
		if profile {
			nd.prof = ports[3*n+i]
			_, port, _ := strings.Cut(nd.prof, ":")
			conf += "prof_port: " + port + "\n"
		}
		path := filepath.Join(nd.dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			stopAll()
			return nil, err
		}
		nd.cmd = exec.Command(bin, "bench", NATSNodeFlag, path)
		nd.cmd.Stderr = &limitedWriter{b: nd.stderr, n: 1 << 20}
		if err := nd.cmd.Start(); err != nil {
			stopAll()
			return nil, fmt.Errorf("starting NATS node %s: %w", nd.name, err)
		}
		go func() {
			_ = nd.cmd.Wait()
			close(nd.done)
		}()
		nodes = append(nodes, nd)
	}
	for _, nd := range nodes {
		if err := nd.waitHealthy(ctx); err != nil {
			stopAll()
			return nil, fmt.Errorf("NATS node %s: %w\n%s", nd.name, err, nd.stderr.String())
		}
	}
	return nodes, nil
}

// waitHealthy waits until the node's monitoring listener says it is
// healthy with JetStream on: it has met the cluster.
func (nd *natsNode) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-nd.done:
			return errors.New("exited")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := http.Get("http://" + nd.monitor + "/healthz?js-enabled-only=true")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("timed out waiting for its health check")
}

// messages reads how many messages the node has received and sent, from
// its monitoring listener's /varz: clients' and the other servers'.
func (nd *natsNode) messages() (in, out uint64, err error) {
	resp, err := http.Get("http://" + nd.monitor + "/varz")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var v struct {
		InMsgs  uint64 `json:"in_msgs"`
		OutMsgs uint64 `json:"out_msgs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return 0, 0, fmt.Errorf("/varz: %w", err)
	}
	return v.InMsgs, v.OutMsgs, nil
}

// stop ends the node with SIGTERM (SIGKILL after 10s).
func (nd *natsNode) stop() {
	if nd.cmd.Process == nil {
		return
	}
	_ = nd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nd.done:
	case <-time.After(10 * time.Second):
		_ = nd.cmd.Process.Kill()
		<-nd.done
	}
}

// clusterConfig returns template with a store block that points at the
// NATS servers of url (comma separated) with the log's replicas given (0:
// automatic), and the frame interval given unless it is empty.
func clusterConfig(template, url string, replicas int, frameInterval string) string {
	extra := ""
	if frameInterval != "" {
		extra = ", frame_interval: " + frameInterval
	}
	return strings.TrimRight(template, "\n") + "\n" +
		fmt.Sprintf("store: {mode: nats, replicas: %d, nats: {url: %q}%s}\n", replicas, url, extra)
}
