// Command memprobe measures what clients that misbehave cost a turnstile
// server: it starts a real `turnstile serve` process on the embedded
// simulator (long replies, no token pacing), drives it, and prints the
// server's resident memory (VmRSS, and its peak VmHWM, from /proc) and open
// file descriptors. It runs outside `go test ./...`, on Linux:
//
//	go run ./internal/memprobe                       # builds ./cmd/turnstile first
//	go run ./internal/memprobe -bin /tmp/turnstile   # a binary built elsewhere
//
// Scenarios (each on a fresh server process):
//
//   - streams: -streams RunTurn calls (-per-conn per connection) whose
//     clients never read an event; with the turn store on, the probe then
//     lets the clients go, watches every turn to its end (WatchTurn from
//     seq 0) and counts the turns whose log has no terminal event.
//     -streams takes a list (300,1000): each count runs in each -store
//     mode, and a table of the peaks, store on against off, ends the run;
//   - limit: the server under a memory limit, for each -streams count and
//     -store mode (limit.go);
//   - silent: -silent TCP connections that never send a byte;
//   - big: -big concurrent requests of -big-bytes each;
//   - resets, unauth, header, peer, burst: see edges.go.
//
// Each scenario runs once per -store mode: off (store: {mode: off}) and on
// (the default embedded store, its files in a temporary directory). The
// figures are the server process's alone; the clients run in this
// process. BENCHMARKS.md records results and how they were taken.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

func main() {
	bin := flag.String("bin", "", "turnstile `binary` to measure (default: build ./cmd/turnstile)")
	scenarios := flag.String("run", "streams,silent,big", "comma-separated `scenarios` to run")
	streams := flag.String("streams", "1000", "comma-separated `counts` of non-reading streams, each a run of its own")
	perConn := flag.Int("per-conn", 100, "streams per connection")
	words := flag.Int("reply-words", 20000, "words of the simulator's reply")
	settle := flag.Duration("settle", 15*time.Second, "how long the streams are held open")
	silent := flag.Int("silent", 3000, "silent TCP connections")
	silentWait := flag.Duration("silent-wait", 20*time.Second, "how long the silent connections are held")
	big := flag.Int("big", 8, "concurrent large requests")
	bigBytes := flag.Int("big-bytes", 3_600_000, "bytes of each large request")
	bigShape := flag.String("big-shape", "messages", "`shape` of a large request: text (one long user message) or messages (many short ones)")
	window := flag.Int("client-window", 64<<10, "HTTP/2 receive `window` of the non-reading clients, fixed; 0: gRPC's default, which grows with the bandwidth-delay estimate up to 16 MiB a stream, so the server can push a turn's whole reply into the client's memory")
	resets := flag.Int("resets", 100_000, "HEADERS+RST_STREAM pairs of the resets scenario")
	unauth := flag.Int("unauth", 20_000, "calls without a key of the unauth scenario")
	headers := flag.Int("headers", 10, "concurrent streams of the header scenario")
	headerBytes := flag.Int("header-bytes", 16<<20-1024, "bytes of the header scenario's one header")
	peerSilent := flag.Int("peer-silent", 1500, "silent connections from 127.0.0.2 of the peer scenario")
	burst := flag.Int("burst", 16, "concurrent requests of the burst scenario")
	burstBytes := flag.Int("burst-bytes", 4_000_000, "bytes of each request of the burst scenario")
	extra := flag.String("config", "", "YAML `lines` appended to the generated configuration (e.g. server settings)")
	env := flag.String("env", "", "comma-separated `VAR=value` pairs added to the server's environment (GOGC=100,GODEBUG=gctrace=1)")
	serverLog := flag.String("server-log", "", "`file` that receives the server's whole log (stderr)")
	stores := flag.String("store", "off,on", "comma-separated turn store `modes` each scenario runs with: off, or on (embedded, files in a temporary directory)")
	memLimit := flag.Int64("mem-limit", 1<<30, "the limit scenario's memory `bytes`: the server's data segment (prlimit --data) and GOMEMLIMIT at 90% of it")
	goodTurns := flag.Int("good-turns", 20, "the limit scenario's turns of the key that reads, one at a time")
	limitData := flag.Bool("limit-data", true, "the limit scenario bounds the server's data segment (prlimit --data); false: GOMEMLIMIT alone, to read the peak RSS a container's limit would meet")
	silentTurns := flag.Int("silent-turns", 400, "the limit scenario's concurrent_turns of the key that never reads (0: every stream)")
	flag.Parse()
	counts, err := parseCounts(*streams)
	check(err)
	var peaks []peak

	if *bin == "" {
		dir, err := os.MkdirTemp("", "memprobe")
		check(err)
		defer os.RemoveAll(dir)
		*bin = filepath.Join(dir, "turnstile")
		out, err := exec.Command("go", "build", "-o", *bin, "./cmd/turnstile").CombinedOutput()
		if err != nil {
			fail("go build: %v\n%s", err, out)
		}
	}
	for s := range strings.SplitSeq(*scenarios, ",") {
		// The edges' scenarios start servers of their own configuration
		// (edges.go), once.
		switch s {
		case "resets":
			probeResets(*bin, *extra, *resets)
			continue
		case "unauth":
			probeUnauth(*bin, *extra, *unauth)
			continue
		case "header":
			probeHeader(*bin, *extra, *headers, *headerBytes)
			continue
		case "peer":
			probePeer(*bin, *extra, *peerSilent)
			continue
		case "burst":
			probeBurst(*bin, *extra, *burst, *burstBytes)
			continue
		}
		for mode := range strings.SplitSeq(*stores, ",") {
			if mode != "on" && mode != "off" {
				fail("unknown store mode %q", mode)
			}
			p := probe{bin: *bin, extra: *extra, store: mode == "on", log: *serverLog}
			if *env != "" {
				p.env = strings.Split(*env, ",")
			}
			switch s {
			case "streams":
				for _, n := range counts {
					peaks = append(peaks, p.streams(n, *perConn, *words, *settle, *window))
				}
			case "limit":
				for _, n := range counts {
					p.limit(n, *words, *settle, *window, *memLimit, *limitData, *goodTurns, *silentTurns)
				}
			case "silent":
				p.silent(*silent, *silentWait)
			case "big":
				p.big(*big, *bigBytes, *bigShape)
			default:
				fail("unknown scenario %q", s)
			}
		}
	}
	printPeaks(peaks)
}

// peak is the peak RSS of one streams run.
type peak struct {
	streams int
	store   bool
	mib     float64
}

// printPeaks prints the streams runs' peaks, store on against store off
// for each count.
func printPeaks(peaks []peak) {
	if len(peaks) == 0 {
		return
	}
	fmt.Println("\nstreams  store off  store on  on/off")
	for _, on := range peaks {
		if !on.store {
			continue
		}
		for _, off := range peaks {
			if off.streams == on.streams && !off.store {
				fmt.Printf("%7d  %5.0f MiB  %4.0f MiB  %5.2f\n", on.streams, off.mib, on.mib, on.mib/off.mib)
			}
		}
	}
}

// parseCounts reads a comma-separated list of positive counts.
func parseCounts(list string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-streams: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// probe is one scenario's server settings.
type probe struct {
	bin, extra string
	store      bool     // the embedded turn store, else store: {mode: off}
	env        []string // added to the server's environment
	log        string   // a file for the server's log, if any
	wrap       []string // a command the server runs under (prlimit ...), if any
}

// label names the scenario and its store mode in the output.
func (p probe) label(scenario string) string {
	if p.store {
		return scenario + " [store on]"
	}
	return scenario + " [store off]"
}

func request(text string) *turnstilev1.RunTurnRequest {
	return &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: text}}},
	}}}
}

// streams opens streams whose clients never read, and returns the
// server's peak RSS while they are held.
func (p probe) streams(n, perConn, words int, settle time.Duration, window int) peak {
	name := p.label(fmt.Sprintf("streams %d", n))
	s := p.start(words)
	defer s.stop()
	rss0, _ := s.mem()
	ctx, cancel := context.WithCancel(context.Background())
	var conns []*grpc.ClientConn
	var mu sync.Mutex
	opened, refused := 0, map[string]int{}
	var ids []string
	var wg sync.WaitGroup
	for i := 0; i < n; i += perConn {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if window > 0 {
			opts = append(opts, grpc.WithInitialWindowSize(int32(window)), grpc.WithInitialConnWindowSize(int32(window)))
		}
		conn, err := grpc.NewClient(s.addr, opts...)
		check(err)
		conns = append(conns, conn)
		client := turnstilev1.NewAgentServiceClient(conn)
		for j := i; j < min(i+perConn, n); j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := request(fmt.Sprintf("stream %d", j))
				req.TurnId = fmt.Sprintf("memprobe-%d", j)
				stream, err := client.RunTurn(ctx, req)
				if err == nil {
					// A RunTurn is refused in its headers: wait for them.
					_, err = stream.Header()
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					refused[err.Error()]++
					return
				}
				opened++
				ids = append(ids, req.TurnId)
			}()
		}
	}
	wg.Wait()
	fmt.Printf("%s: %d opened (client window %d), %d refused %v; sampling for %s\n", name, opened, window, n-opened, refused, settle)
	high := sample(s, settle)
	ok, took := s.healthy()
	rss, hwm := s.mem()
	fmt.Printf("%s: server RSS before %.0f MiB, peak while held %.0f MiB (VmHWM %.0f MiB), now %.0f MiB; fds %d; health ok=%v in %s\n",
		name, rss0, high, hwm, rss, s.fds(), ok, took.Round(time.Millisecond))
	cancel()
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(3 * time.Second)
	rss, _ = s.mem()
	fmt.Printf("%s: 3s after the clients went away: RSS %.0f MiB, fds %d\n", name, rss, s.fds())
	if p.store {
		p.ends(s, name, ids)
	}
	return peak{streams: n, store: p.store, mib: high}
}

// ends watches each turn of ids from its first event to the end of its
// log, a few at a time, and prints how the turns ended: with their
// terminal event (its kind), or without one.
func (p probe) ends(s *server, name string, ids []string) {
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	check(err)
	defer conn.Close()
	client := turnstilev1.NewAgentServiceClient(conn)
	start := time.Now()
	var mu sync.Mutex
	outcomes := map[string]int{}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for id := range work {
				o := watchEnd(client, id)
				mu.Lock()
				outcomes[o]++
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	_, hwm := s.mem()
	fmt.Printf("%s: every turn watched to its end in %s: %v; server log lines of turns ended without their terminal event: %d; VmHWM %.0f MiB\n",
		name, time.Since(start).Round(time.Millisecond), outcomes, s.lost.Load(), hwm)
}

// watchEnd reads the log of turn id from its first event and says how it
// ends: the kind of its terminal event, or what went wrong.
func watchEnd(client turnstilev1.AgentServiceClient, id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, err := client.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: id})
	if err != nil {
		return "watch: " + err.Error()
	}
	var last *turnstilev1.AgentEvent
	for {
		resp, err := stream.Recv()
		if err != nil {
			switch {
			case last == nil && status.Code(err) == codes.NotFound:
				// Refused by a limit (a refusal arrives in the
				// trailers, which a client that never reads does not see).
				return "never run (refused)"
			case last == nil:
				return "no event: " + clipped(err)
			case last.GetTurnCompleted() != nil:
				return "turn_completed"
			case last.GetError() != nil:
				return "error " + last.GetError().GetCode().String()
			}
			return "no terminal event: " + clipped(err)
		}
		ev := resp.GetEvent()
		if want := last.GetSeq() + 1; ev.GetSeq() != want {
			return fmt.Sprintf("seq %d where %d was due", ev.GetSeq(), want)
		}
		last = ev
	}
}

func clipped(err error) string {
	s := err.Error()
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

// sample polls the server's RSS for d and returns the highest value seen.
func sample(s *server, d time.Duration) float64 {
	peak := 0.0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if rss, _ := s.mem(); rss > peak {
			peak = rss
		}
		time.Sleep(200 * time.Millisecond)
	}
	return peak
}

// probeSilent opens TCP connections that never send anything and counts
// how many the server still holds open after wait.
func (p probe) silent(n int, wait time.Duration) {
	name := p.label("silent")
	s := p.start(10)
	defer s.stop()
	fds0 := s.fds()
	var conns []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", s.addr, 2*time.Second)
		if err != nil {
			fmt.Printf("%s: dial failed after %d connections: %v\n", name, len(conns), err)
			break
		}
		conns = append(conns, c)
	}
	time.Sleep(time.Second)
	fmt.Printf("%s: %d connections dialled; server fds %d (%d before)\n", name, len(conns), s.fds(), fds0)
	time.Sleep(wait)
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		buf := make([]byte, 4096)
		for {
			_, err := c.Read(buf)
			if err == nil {
				continue
			}
			var ne net.Error
			if !(errors.As(err, &ne) && ne.Timeout()) {
				closed++
			}
			break
		}
	}
	ok, took := s.healthy()
	rss, _ := s.mem()
	fmt.Printf("%s: after %s the server had closed %d of %d; server fds %d; RSS %.0f MiB; health ok=%v in %s\n",
		name, wait, closed, len(conns), s.fds(), rss, ok, took.Round(time.Millisecond))
	for _, c := range conns {
		c.Close()
	}
}

// big sends n concurrent requests of size bytes each and reads them to
// their end.
func (p probe) big(n, size int, shape string) {
	name := p.label("big")
	s := p.start(10)
	defer s.stop()
	rss0, _ := s.mem()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	check(err)
	defer conn.Close()
	client := turnstilev1.NewAgentServiceClient(conn)
	req := request(strings.Repeat("abcdefgh ", size/9))
	if shape == "messages" {
		// Alternating user and assistant messages of one short text part
		// each: about 12 bytes per message on the wire.
		req.Messages = nil
		for i := range size / 12 {
			role := turnstilev1.Role_ROLE_USER
			if i%2 == 1 {
				role = turnstilev1.Role_ROLE_ASSISTANT
			}
			req.Messages = append(req.Messages, &turnstilev1.Message{Role: role, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hi"}}}})
		}
		if len(req.Messages)%2 == 0 {
			req.Messages = req.Messages[1:]
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	results := map[string]int{}
	start := time.Now()
	for range n {
		wg.Go(func() {
			stream, err := client.RunTurn(context.Background(), req)
			outcome := "ok"
			if err == nil {
				for {
					if _, err = stream.Recv(); err != nil {
						break
					}
				}
			}
			if err != nil && err != io.EOF {
				outcome = err.Error()
				if len(outcome) > 120 {
					outcome = outcome[:120] + "..."
				}
			}
			mu.Lock()
			results[outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	rss, hwm := s.mem()
	fmt.Printf("%s: %d requests of %d bytes (%s, %d messages) in %s: %v; server RSS before %.0f MiB, peak (VmHWM) %.0f MiB, now %.0f MiB\n",
		name, n, proto.Size(req), shape, len(req.Messages), time.Since(start).Round(time.Millisecond), results, rss0, hwm, rss)
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "memprobe: "+format+"\n", args...)
	os.Exit(1)
}
