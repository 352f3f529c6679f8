package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// sample is what one turn took, seen by the caller.
type sample struct {
	firstDelta time.Duration // to the first text delta
	total      time.Duration // to the end of the stream
}

// turnFunc runs one turn and reports what it took.
type turnFunc func(ctx context.Context) (sample, error)

// result is one load phase: its turns' samples and its wall time.
type result struct {
	samples  []sample
	errors   int
	wall     time.Duration
	firstErr error
}

// drive runs n turns of fn with concurrency workers and collects them.
func drive(ctx context.Context, n, concurrency int, fn turnFunc) result {
	var (
		next     atomic.Int64
		mu       sync.Mutex
		res      result
		wg       sync.WaitGroup
		start    = time.Now()
		samples  = make([][]sample, concurrency)
		failures = make([]int, concurrency)
	)
	for w := range concurrency {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				s, err := fn(ctx)
				if err != nil {
					failures[w]++
					mu.Lock()
					if res.firstErr == nil {
						res.firstErr = err
					}
					mu.Unlock()
					continue
				}
				samples[w] = append(samples[w], s)
			}
		})
	}
	wg.Wait()
	res.wall = time.Since(start)
	for w := range concurrency {
		res.samples = append(res.samples, samples[w]...)
		res.errors += failures[w]
	}
	return res
}

// directTurn returns a turnFunc that streams one chat completion from the
// upstream with client, reading it to its end: the floor every gateway is
// measured against.
func directTurn(client *http.Client, url string) turnFunc {
	body := []byte(`{"messages":[{"content":"hello","role":"user"}],"model":"bench-model","stream":true,"stream_options":{"include_usage":true}}`)
	return func(ctx context.Context) (sample, error) {
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/chat/completions", bytes.NewReader(body))
		if err != nil {
			return sample{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return sample{}, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return sample{}, fmt.Errorf("upstream: %s", resp.Status)
		}
		var s sample
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadSlice('\n')
			if s.firstDelta == 0 && bytes.Contains(line, []byte(`"content":"`)) && !bytes.Contains(line, []byte(`"content":""`)) {
				s.firstDelta = time.Since(start)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return sample{}, err
			}
		}
		s.total = time.Since(start)
		if s.firstDelta == 0 {
			return sample{}, errors.New("upstream: no content")
		}
		return s, nil
	}
}

// grpcTurn returns a turnFunc that runs one turn on model through the
// server with client, to the end of its stream.
func grpcTurn(client turnstilev1.AgentServiceClient, model string) turnFunc {
	return func(ctx context.Context) (sample, error) {
		start := time.Now()
		stream, err := client.RunTurn(ctx, &turnstilev1.RunTurnRequest{
			Model: model,
			Messages: []*turnstilev1.Message{{
				Role:  turnstilev1.Role_ROLE_USER,
				Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hello"}}},
			}},
		})
		if err != nil {
			return sample{}, err
		}
		var (
			s         sample
			completed bool
		)
		for {
			resp, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return sample{}, err
			}
			ev := resp.GetEvent()
			if s.firstDelta == 0 && ev.GetTextDelta() != nil {
				s.firstDelta = time.Since(start)
			}
			if ev.GetTurnCompleted() != nil {
				completed = true
			}
		}
		s.total = time.Since(start)
		if !completed || s.firstDelta == 0 {
			return sample{}, errors.New("turn ended without text or completion")
		}
		return s, nil
	}
}

// dial opens n gRPC connections to each of addrs and returns their
// clients, used round-robin (one address after the other), and a function
// that closes them.
func dial(addrs []string, n int) (func() turnstilev1.AgentServiceClient, func(), error) {
	var (
		conns   []*grpc.ClientConn
		clients []turnstilev1.AgentServiceClient
		next    atomic.Uint64
	)
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for range n {
		for _, addr := range addrs {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			conn.Connect()
			conns = append(conns, conn)
			clients = append(clients, turnstilev1.NewAgentServiceClient(conn))
		}
	}
	return func() turnstilev1.AgentServiceClient {
		return clients[(next.Add(1)-1)%uint64(len(clients))]
	}, closeAll, nil
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// latencies are the percentiles of a phase's samples.
type latencies struct {
	firstP50, firstP99 time.Duration
	totalP50, totalP99 time.Duration
	firstMax           time.Duration
}

func summarize(samples []sample) latencies {
	first := make([]time.Duration, len(samples))
	total := make([]time.Duration, len(samples))
	for i, s := range samples {
		first[i], total[i] = s.firstDelta, s.total
	}
	slices.Sort(first)
	slices.Sort(total)
	l := latencies{
		firstP50: percentile(first, 50), firstP99: percentile(first, 99),
		totalP50: percentile(total, 50), totalP99: percentile(total, 99),
	}
	if len(first) > 0 {
		l.firstMax = first[len(first)-1]
	}
	return l
}
