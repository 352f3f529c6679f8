package store

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestLeaderKillPause measures what an unclean death of the NATS server
// leading the log's stream costs the runs in flight: three nats-server
// processes form a cluster, two replicas' stores own runs that append an
// event every 20ms (a model's deltas), and the server leading
// TURNSTILE_RUNS (the stream info's cluster leader) is killed with
// SIGKILL, then restarted once the runs go on, TURNSTILE_LEADER_KILLS
// times. A run's pause is the longest wait between two acknowledged
// appends around a kill; it reports them per kill and their p50 and p99
// over every run and kill, and fails on a failed append or a run taken
// over from a live owner. It runs only with TURNSTILE_LEADER_KILLS set
// (BENCHMARKS.md); TURNSTILE_NATS_SERVER names the nats-server binary,
// else it is built from the module cache.
func TestLeaderKillPause(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv("TURNSTILE_LEADER_KILLS"))
	if kills <= 0 {
		t.Skip("set TURNSTILE_LEADER_KILLS to the number of kills (BENCHMARKS.md)")
	}
	bin := os.Getenv("TURNSTILE_NATS_SERVER")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "nats-server")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
			t.Fatalf("build nats-server: %v\n%s", err, out)
		}
	}
	c := startProcessCluster(t, bin, 3)
	urls := strings.Join(c.urls, ",")

	open := func() *Store {
		cfg := DefaultConfig()
		cfg.Mode, cfg.NATS.URL = ModeNATS, urls
		// Tried again for a store that did not wait for a forming
		// cluster (the figures before it did were measured so).
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			s, err := Open(context.Background(), cfg, nil)
			if err == nil {
				t.Cleanup(s.Close)
				return s
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
	}
	replicas := []*Store{open(), open()}
	js := replicas[0].js

	// A watcher on each replica claims whatever expires: a claim that
	// succeeds takes a run from its live owner.
	var stolen sync.Map
	for _, s := range replicas {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() {
			_ = s.WatchExpired(ctx, func(id string, attempt uint32) {
				if _, _, _, err := s.Claim(ctx, id, attempt, func(string) []byte { return nil }); err == nil {
					stolen.Store(id, true)
				}
			})
		}()
	}

	const runs = 12
	type run struct {
		mu     sync.Mutex
		acks   []time.Time
		failed error
	}
	rs := make([]*run, runs)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range rs {
		r := &run{}
		rs[i] = r
		s := replicas[i%len(replicas)]
		id := fmt.Sprintf("kill-%d", i)
		if _, _, err := s.Create(context.Background(), id, 1, []byte("req"), func(string) []byte { return nil }); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				err := s.Append(context.Background(), id, 1, []byte("delta"), func(err error) {
					r.mu.Lock()
					defer r.mu.Unlock()
					if err != nil && r.failed == nil {
						r.failed = err
					}
					if err == nil {
						r.acks = append(r.acks, time.Now())
					}
				})
				if err != nil {
					r.mu.Lock()
					if r.failed == nil {
						r.failed = err
					}
					r.mu.Unlock()
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	// TURNSTILE_LEADER_KILL_TARGET=leases kills the lease bucket's leader
	// instead: the live owners' leases expire, and none may be taken over.
	target := StreamName
	if os.Getenv("TURNSTILE_LEADER_KILL_TARGET") == "leases" {
		target = "KV_" + LeaseBucket
	}
	leader := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, target)
		if err != nil {
			return ""
		}
		if cl := st.CachedInfo().Cluster; cl != nil {
			return cl.Leader
		}
		return ""
	}
	streamLeader := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, StreamName)
		if err != nil || st.CachedInfo().Cluster == nil {
			return ""
		}
		return st.CachedInfo().Cluster.Leader
	}
	// caughtUp reports whether the stream has a leader and every replica
	// is current.
	caughtUp := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, target)
		if err != nil {
			return false
		}
		cl := st.CachedInfo().Cluster
		if cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
			return false
		}
		for _, p := range cl.Replicas {
			if !p.Current || p.Offline {
				return false
			}
		}
		return true
	}
	var all, afterElection []time.Duration
	time.Sleep(2 * time.Second)
	for k := range kills {
		for deadline := time.Now().Add(60 * time.Second); !caughtUp(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: the stream did not recover its three replicas", k)
			}
		}
		time.Sleep(time.Second)
		name := leader()
		if target != StreamName {
			// The lease bucket must have been without a leader for longer
			// than the lease TTL (2s) for leases to expire.
			t.Logf("kill %d: the stream's leader is on the server killed: %v", k+1, name == streamLeader())
		}
		killed := time.Now()
		c.kill(t, name)
		// When the cluster has a new leader, polled every 20ms: the pause
		// beyond it is the replicas' own.
		elected := make(chan time.Time, 1)
		go func() {
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				st, err := js.Stream(ctx, target)
				cancel()
				if err == nil && st.CachedInfo().Cluster != nil {
					if l := st.CachedInfo().Cluster.Leader; l != "" && l != name {
						elected <- time.Now()
						return
					}
				}
			}
			elected <- time.Time{}
		}()
		// Wait until every run stores events again: its last append
		// acknowledged within 200ms, a second or more after the kill.
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			resumed := 0
			for _, r := range rs {
				r.mu.Lock()
				if r.failed != nil {
					r.mu.Unlock()
					t.Fatalf("kill %d: an append failed: %v", k, r.failed)
				}
				if n := len(r.acks); n > 0 && time.Since(killed) > time.Second && time.Since(r.acks[n-1]) < 200*time.Millisecond {
					resumed++
				}
				r.mu.Unlock()
			}
			if resumed == len(rs) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: %d of %d runs resumed within a minute", k, resumed, len(rs))
			}
		}
		var pauses, after []time.Duration
		at := <-elected
		for _, r := range rs {
			r.mu.Lock()
			pauses = append(pauses, pauseAround(r.acks, killed))
			for _, a := range r.acks {
				if !at.IsZero() && a.After(at) {
					after = append(after, a.Sub(at))
					break
				}
			}
			r.mu.Unlock()
		}
		slices.Sort(after)
		if len(after) > 0 {
			afterElection = append(afterElection, after...)
			t.Logf("kill %d: new leader seen %v after the kill; first append %v-%v after it", k+1,
				at.Sub(killed).Round(time.Millisecond), after[0].Round(time.Millisecond), after[len(after)-1].Round(time.Millisecond))
		}
		slices.Sort(pauses)
		all = append(all, pauses...)
		t.Logf("kill %d of %s (leader of %s): pause min %v, median %v, max %v", k+1, name,
			target, pauses[0].Round(time.Millisecond), pauses[len(pauses)/2].Round(time.Millisecond), pauses[len(pauses)-1].Round(time.Millisecond))
		c.restart(t, name)
	}
	slices.Sort(all)
	if len(afterElection) > 0 {
		slices.Sort(afterElection)
		t.Logf("first append after the new leader was seen: p50 %v, p99 %v", percentile(afterElection, 50).Round(time.Millisecond),
			percentile(afterElection, 99).Round(time.Millisecond))
	}
	t.Logf("%d kills, %d runs: pause p50 %v, p99 %v, max %v", kills, runs, percentile(all, 50).Round(time.Millisecond),
		percentile(all, 99).Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond))
	n := 0
	stolen.Range(func(any, any) bool { n++; return true })
	t.Logf("runs taken over from their live owner: %d", n)
	stolen.Range(func(id, _ any) bool {
		t.Errorf("run %v was taken over from its live owner", id)
		return true
	})
}

// pauseAround returns the longest wait between two acknowledgements of
// acks from a second before the kill on.
func pauseAround(acks []time.Time, killed time.Time) time.Duration {
	var longest time.Duration
	for i := 1; i < len(acks); i++ {
		if acks[i].Before(killed.Add(-time.Second)) {
			continue
		}
		longest = max(longest, acks[i].Sub(acks[i-1]))
	}
	return longest
}

func percentile(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p+99)/100 - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// processCluster is a JetStream cluster of nats-server processes.
type processCluster struct {
	bin   string
	dir   string
	urls  []string
	confs map[string]string // by server name
	procs map[string]*exec.Cmd
}

func startProcessCluster(t *testing.T, bin string, n int) *processCluster {
	t.Helper()
	c := &processCluster{bin: bin, dir: t.TempDir(), confs: map[string]string{}, procs: map[string]*exec.Cmd{}}
	ports := make([]int, 2*n)
	var ls []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	for i := range n {
		name := fmt.Sprintf("p%d", i)
		conf := filepath.Join(c.dir, name+".conf")
		body := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
max_payload: 8MB
jetstream { store_dir: %q }
cluster { name: kill, listen: 127.0.0.1:%d, routes: [%s] }
`, name, ports[i], filepath.Join(c.dir, name), ports[n+i], strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		c.confs[name] = conf
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	t.Cleanup(func() {
		for _, p := range c.procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	})
	for name := range c.confs {
		c.restart(t, name)
	}
	return c
}

// restart starts the server name (again), on its store directory.
func (c *processCluster) restart(t *testing.T, name string) {
	t.Helper()
	cmd := exec.Command(c.bin, "-c", c.confs[name])
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.procs[name] = cmd
}

// kill ends the server name with SIGKILL.
func (c *processCluster) kill(t *testing.T, name string) {
	t.Helper()
	p := c.procs[name]
	if p == nil {
		t.Fatalf("no server %q leads the stream", name)
	}
	_ = p.Process.Signal(syscall.SIGKILL)
	_ = p.Wait()
	delete(c.procs, name)
}
