package bench

// What the bench reads of the processes it runs: their CPU and message
// counters, the servers' ops listener (the store's size, the runtime's
// memory classes, profiles).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// stats are the counters of every process of a shape, and the bench's own
// CPU time, at one moment.
type stats struct {
	servers []procStats
	nodes   []time.Duration // the NATS servers' CPU time
	// natsIn and natsOut are the messages the NATS servers received and
	// sent, summed over them.
	natsIn, natsOut uint64
	bench           time.Duration
}

// shapeStats reads the counters of the servers and NATS servers given,
// and the bench's own CPU time.
func shapeStats(servers []*child, nodes []*natsNode) (stats, error) {
	var st stats
	for _, srv := range servers {
		s, err := srv.stats()
		if err != nil {
			return st, err
		}
		st.servers = append(st.servers, s)
	}
	for _, nd := range nodes {
		cpu, err := procCPU(nd.cmd.Process.Pid)
		if err != nil {
			return st, fmt.Errorf("NATS node %s: %w", nd.name, err)
		}
		st.nodes = append(st.nodes, cpu)
		in, out, err := nd.messages()
		if err != nil {
			return st, fmt.Errorf("NATS node %s: %w", nd.name, err)
		}
		st.natsIn, st.natsOut = st.natsIn+in, st.natsOut+out
	}
	// The bench's own: 0 where /proc cannot tell (not Linux).
	st.bench, _ = procCPU(os.Getpid())
	return st, nil
}

// storedMessages reads how many messages the turn log holds from a
// server's /debug/store (on its ops listener with pprof).
func storedMessages(opsAddr string) (uint64, error) {
	resp, err := http.Get("http://" + opsAddr + "/debug/store")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("/debug/store: %s", resp.Status)
	}
	var v struct {
		Messages uint64 `json:"messages"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return 0, fmt.Errorf("/debug/store: %w", err)
	}
	return v.Messages, nil
}

// memStats are the server runtime's memory classes at one moment.
type memStats struct {
	heapInuse, stackInuse int64
}

// memClasses reads the server runtime's heap spans and goroutine stacks
// in use from the MemStats that its text heap profile ends with
// ("# HeapInuse = N", "# Stack = StackInuse / StackSys").
func memClasses(opsAddr string) (memStats, error) {
	var m memStats
	resp, err := http.Get("http://" + opsAddr + "/debug/pprof/heap?debug=1")
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return m, err
	}
	found := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		for name, dst := range map[string]*int64{"# HeapInuse = ": &m.heapInuse, "# Stack = ": &m.stackInuse} {
			if v, ok := strings.CutPrefix(line, name); ok {
				v, _, _ = strings.Cut(v, " /")
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return m, fmt.Errorf("heap profile: %s: %w", line, err)
				}
				*dst = n
				found++
			}
		}
	}
	if found != 2 {
		return m, errors.New("heap profile: no HeapInuse and StackInuse")
	}
	return m, nil
}

// runtimeGC asks the server to collect garbage and return memory, so two
// readings of its resident set compare live memory.
func runtimeGC(srv *child) {
	resp, err := http.Post("http://"+srv.ops+"/debug/gc", "", nil)
	if err == nil {
		_ = resp.Body.Close()
	}
}

// fetchProfile saves the server's CPU profile of the next seconds.
func fetchProfile(opsAddr, path string, seconds int) {
	fetchPath(opsAddr, fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds), path)
}

// fetchAllocs saves the server's allocation profile (its counts since
// the start): a phase's allocations are those of the profile taken after
// it less the one taken before (go tool pprof -base).
func fetchAllocs(opsAddr, path string) { fetchPath(opsAddr, "/debug/pprof/allocs", path) }

// fetchPath saves what the server's ops listener serves at urlPath to path.
func fetchPath(opsAddr, urlPath, path string) {
	resp, err := http.Get("http://" + opsAddr + urlPath)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}
