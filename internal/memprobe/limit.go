package main

// The limit scenario (issue 37): the server, in each -store mode, runs
// under a memory limit, its data segment bounded by prlimit --data (what
// it maps writable: its heap, whether resident or not; stricter than a
// cgroup's limit, which counts what is resident) and GOMEMLIMIT at 90% of
// it, as `serve` sets it from a container's limit; -limit-data=false
// keeps GOMEMLIMIT alone, to read the peak RSS a cgroup would meet. One client key,
// silent, opens -streams RunTurn calls whose clients read their first
// event and nothing more (at most -silent-turns of them run: the key's
// concurrent_turns); meanwhile another key, good, runs -good-turns turns
// one at a time and reads each to its end.
// The probe prints whether the server stayed up, how the good key's turns
// ended and how long they took, and the server's peak RSS.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// The tokens of the limit scenario's two keys.
const (
	silentToken = "memprobe-silent-token-0123456789"
	goodToken   = "memprobe-good-token-0123456789ab"
)

func digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// limit runs the limit scenario in p's store mode: n silent streams of
// replies of words words held for hold (at most silentTurns of them
// running), good turns of the good key meanwhile, the server's memory
// bounded by limit bytes.
func (p probe) limit(n, words int, hold time.Duration, window int, limit int64, data bool, good, silentTurns int) {
	if silentTurns <= 0 {
		silentTurns = n
	}
	if data {
		p.wrap = []string{"prlimit", "--data=" + strconv.FormatInt(limit, 10), "--"}
	}
	p.env = append(slices.Clip(p.env), "GOMEMLIMIT="+strconv.FormatInt(limit*9/10, 10))
	p.extra = fmt.Sprintf(`auth:
  keys:
    - {name: silent, token_sha256: %s, limits: {concurrent_turns: %d}}
    - {name: good, token_sha256: %s}
%s`, digest(silentToken), silentTurns, digest(goodToken), p.extra)
	how := "data segment and GOMEMLIMIT"
	if !data {
		how = "GOMEMLIMIT alone"
	}
	name := p.label(fmt.Sprintf("limit %d MiB (%s), %d silent streams", limit>>20, how, n))
	s := p.start(words)
	defer s.stop()
	rss0, _ := s.mem()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	silent := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+silentToken)
	var conns []*grpc.ClientConn
	var mu sync.Mutex
	opened, refused := 0, map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < n; i += 100 {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if window > 0 {
			opts = append(opts, grpc.WithInitialWindowSize(int32(window)), grpc.WithInitialConnWindowSize(int32(window)))
		}
		conn, err := grpc.NewClient(s.addr, opts...)
		check(err)
		conns = append(conns, conn)
		client := turnstilev1.NewAgentServiceClient(conn)
		for j := i; j < min(i+100, n); j++ {
			wg.Go(func() {
				req := request(fmt.Sprintf("silent %d", j))
				stream, err := client.RunTurn(silent, req)
				if err == nil {
					// Its first event, or the status of a turn refused
					// (a refusal has no header of its own).
					_, err = stream.Recv()
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					refused[clipped(err)]++
					return
				}
				opened++
			})
		}
	}
	wg.Wait()
	fmt.Printf("%s: %d silent streams opened, %d refused %v\n", name, opened, n-opened, refused)

	// The good key's turns, one at a time, read to their end, while the
	// silent streams are held; the server's RSS sampled meanwhile.
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	check(err)
	defer conn.Close()
	client := turnstilev1.NewAgentServiceClient(conn)
	done := make(chan struct{})
	var high float64
	go func() {
		high = sample(s, hold)
		close(done)
	}()
	outcomes := map[string]int{}
	var took []time.Duration
	for i := range good {
		start := time.Now()
		outcomes[goodTurn(ctx, client, i)]++
		took = append(took, time.Since(start))
	}
	<-done
	ok, health := s.healthy()
	rss, hwm := s.mem()
	fmt.Printf("%s: the good key's %d turns: %v, each %s; server up (health ok)=%v in %s; RSS before %.0f MiB, peak %.0f MiB (VmHWM %.0f MiB), now %.0f MiB; log lines of turns without their terminal event: %d\n",
		name, good, outcomes, spread(took), ok, health.Round(time.Millisecond), rss0, high, hwm, rss, s.lost.Load())
	cancel()
	for _, c := range conns {
		c.Close()
	}
}

// goodTurn runs one turn of the good key and reads it to its end; it
// says how it ended.
func goodTurn(ctx context.Context, client turnstilev1.AgentServiceClient, i int) string {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+goodToken), 2*time.Minute)
	defer cancel()
	stream, err := client.RunTurn(ctx, request(fmt.Sprintf("good %d", i)))
	if err != nil {
		return clipped(err)
	}
	var last *turnstilev1.AgentEvent
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			if last.GetTurnCompleted() != nil {
				return "turn_completed"
			}
			return "ended without turn_completed"
		}
		if err != nil {
			return clipped(err)
		}
		last = resp.GetEvent()
	}
}

// spread says the least, the median and the most of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%s / %s / %s (least / median / most)", s[0].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}
