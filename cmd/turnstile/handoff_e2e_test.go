package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// TestHandOffOfManyTurns stops, with SIGTERM, a `turnstile serve` replica
// that runs 1, 8 and then 24 turns longer than its shutdown grace, beside
// two other replicas on one NATS server. Each turn's client reads it on
// the stopped replica until its stream ends UNAVAILABLE (handed off), and
// watches it again on another replica from its last seq, in one call:
// every turn completes, its events are the log's, gap-free, and the
// interrupted output is discarded. It logs, for each count, three
// measures of each client's wait (BENCHMARKS.md, "SIGTERM hand-off"): the
// pause between its last event from the stopped replica and its first
// from the other, which holds, besides the hand-off, the time since the
// reply's last stored frame when the grace ended (up to
// store.frame_interval, by where the stop falls between two frames); the
// time from the grace's end (the SIGTERM's time and the shutdown grace)
// to that first event: the stop, the release, the claim, the new owner's
// first event and the watch; and the wait from its stream's end (the run
// released) to that first event. TURNSTILE_HANDOFF_TURNS replaces the
// counts (e.g. "24"), TURNSTILE_HANDOFF_ROUNDS repeats each.
func TestHandOffOfManyTurns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three servers")
	}
	bin := cmp.Or(os.Getenv("TURNSTILE_BIN"), "")
	if bin == "" {
		bin = turnstileBinary(t)
	}
	url := natstest.Start(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `
providers:
  sim: {type: simulator, token_delay: 20ms}
models:
  sim: {provider: sim, model: turnstile-sim-1}
store:
  mode: nats
  nats: {url: %s}
server: {shutdown_grace: %s, drain_delay: 0s}
`, url, handOffGrace), 0o600); err != nil {
		t.Fatal(err)
	}
	counts := []int{1, 8, 24}
	if s := os.Getenv("TURNSTILE_HANDOFF_TURNS"); s != "" {
		counts = nil
		for f := range strings.SplitSeq(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				t.Fatalf("TURNSTILE_HANDOFF_TURNS: %q", s)
			}
			counts = append(counts, n)
		}
	}
	rounds := 1
	if s := os.Getenv("TURNSTILE_HANDOFF_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("TURNSTILE_HANDOFF_ROUNDS: %q", s)
		}
		rounds = n
	}
	procs := make([]*process, 3)
	for i := range procs {
		procs[i] = startReplica(t, t, bin, config, freeAddr(t))
	}
	conns := make([]turnstilev1.AgentServiceClient, len(procs))
	for i, p := range procs {
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns[i] = turnstilev1.NewAgentServiceClient(conn)
	}
	all := map[int][]waits{}
	for round := range rounds {
		for _, n := range counts {
			// The replica stopped this time, and the one its clients
			// watch again on.
			stop, other := round%len(procs), (round+1)%len(procs)
			t.Run(fmt.Sprintf("%d turns", n), func(t *testing.T) {
				ws := handOff(t, conns[stop], conns[other], procs[stop], fmt.Sprintf("r%d-n%d", round, n), n)
				all[n] = append(all[n], ws...)
				pauses := pick(ws, func(w waits) time.Duration { return w.pause })
				t.Logf("SIGTERM with %d running turns: the clients' pause across the hand-off: p50 %v, max %v (all: %v); %s",
					n, pauses[len(pauses)/2].Round(time.Millisecond), pauses[len(pauses)-1].Round(time.Millisecond), roundAll(pauses), summary(ws))
			})
			procs[stop] = startReplica(t, t, bin, config, procs[stop].addr)
		}
	}
	for _, n := range counts {
		if len(all[n]) == 0 {
			continue
		}
		t.Logf("SIGTERM with %d running turns, %d rounds, %d turns: %s", n, rounds, len(all[n]), summary(all[n]))
	}
}

// waits are one client's measures of a hand-off (see
// TestHandOffOfManyTurns).
type waits struct {
	// pause is from its last event before the hand-off to its first after.
	pause time.Duration
	// sinceGrace is from the shutdown grace's end to its first event
	// after.
	sinceGrace time.Duration
	// afterEnd is from its stream's end to its first event after.
	afterEnd time.Duration
	// firstAfter is when its first event after came.
	firstAfter time.Time
}

// handOffGrace is the stopped replica's shutdown grace.
const handOffGrace = time.Second

// summary gives the p50, p99 and max of each measure of ws.
func summary(ws []waits) string {
	var b strings.Builder
	for i, m := range []struct {
		name string
		of   func(waits) time.Duration
	}{
		{"pause", func(w waits) time.Duration { return w.pause }},
		{"since the grace's end", func(w waits) time.Duration { return w.sinceGrace }},
		{"from the stream's end", func(w waits) time.Duration { return w.afterEnd }},
	} {
		ds := pick(ws, m.of)
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s p50 %v, p99 %v, max %v", m.name, ds[len(ds)/2].Round(time.Millisecond),
			ds[(len(ds)*99)/100].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	}
	return b.String()
}

// pick returns the measure of of each of ws, sorted.
func pick(ws []waits, of func(waits) time.Duration) []time.Duration {
	ds := make([]time.Duration, len(ws))
	for i, w := range ws {
		ds[i] = of(w)
	}
	slices.Sort(ds)
	return ds
}

// handOff starts n turns on the replica a client talks to through on,
// stops it (p) with SIGTERM once every turn streams, watches each turn
// again through other when its stream ends, and returns each client's
// waits across the hand-off.
func handOff(t *testing.T, on, other turnstilev1.AgentServiceClient, p *process, prefix string, n int) []waits {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// 150 words at 20ms: 3 s, longer than the grace (1s).
	prompt := `[sim reply="` + strings.Repeat("word ", 149) + `end"] talk`
	type result struct {
		waits waits
		err   error
	}
	results := make([]result, n)
	var streaming sync.WaitGroup
	streaming.Add(n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("%s-%d", prefix, i)
			results[i].waits, results[i].err = handedTurn(ctx, on, other, id, prompt, streaming.Done)
		})
	}
	streaming.Wait()
	stopped := make(chan struct{})
	graceEnd := time.Now().Add(handOffGrace)
	go func() { p.kill(syscall.SIGTERM); close(stopped) }()
	wg.Wait()
	<-stopped
	ws := make([]waits, n)
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("turn %d: %v", i, r.err)
		}
		ws[i] = r.waits
		ws[i].sinceGrace = r.waits.firstAfter.Sub(graceEnd)
	}
	return ws
}

// handedTurn runs turn id on on until its stream ends UNAVAILABLE (calling
// streaming at its first text delta), then watches it again on other from
// its last seq, to its end; it checks the events against the log and
// returns the client's waits across the hand-off.
func handedTurn(ctx context.Context, on, other turnstilev1.AgentServiceClient, id, prompt string, streaming func()) (waits, error) {
	req := &turnstilev1.RunTurnRequest{TurnId: id, Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: prompt}}},
	}}}
	stream, err := on.RunTurn(ctx, req)
	if err != nil {
		streaming()
		return waits{}, err
	}
	var got []*turnstilev1.AgentEvent
	var last time.Time
	told := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			if !told {
				streaming()
			}
			if status.Code(err) != codes.Unavailable {
				return waits{}, fmt.Errorf("the stream on the stopped replica ended %v, want UNAVAILABLE (handed off)", err)
			}
			break
		}
		got = append(got, resp.GetEvent())
		last = time.Now()
		if !told && resp.GetEvent().GetTextDelta() != nil {
			told = true
			streaming()
		}
	}
	ended := time.Now()
	w, err := other.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: id, Attempt: 1, AfterSeq: got[len(got)-1].GetSeq()})
	if err != nil {
		return waits{}, err
	}
	var ws waits
	for {
		resp, err := w.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return waits{}, fmt.Errorf("the watch on another replica ended %v after %s", err, wiretest.Names(got))
		}
		if ws.pause == 0 {
			ws.firstAfter = time.Now()
			ws.pause, ws.afterEnd = ws.firstAfter.Sub(last), ws.firstAfter.Sub(ended)
		}
		got = append(got, resp.GetEvent())
	}
	if got[len(got)-1].GetTurnCompleted() == nil {
		return waits{}, fmt.Errorf("no turn_completed: %s", wiretest.Names(got))
	}
	discarded := false
	for _, ev := range got {
		discarded = discarded || ev.GetRetry().GetDiscardPartial()
	}
	if !discarded {
		return waits{}, fmt.Errorf("no retry told the client to drop the interrupted output: %s", wiretest.Names(got))
	}
	log, _ := watchAll(ctx, other, id)
	if len(log) != len(got) {
		return waits{}, fmt.Errorf("the client saw %d events, the log holds %d", len(got), len(log))
	}
	for i := range got {
		if got[i].GetSeq() != uint64(i+1) || !proto.Equal(got[i], log[i]) {
			return waits{}, fmt.Errorf("event %d differs from the log", i+1)
		}
	}
	return ws, nil
}

// watchAll reads turn id's attempt 1 from its first event to its end.
func watchAll(ctx context.Context, c turnstilev1.AgentServiceClient, id string) ([]*turnstilev1.AgentEvent, error) {
	w, err := c.WatchTurn(ctx, &turnstilev1.WatchTurnRequest{TurnId: id, Attempt: 1})
	if err != nil {
		return nil, err
	}
	var evs []*turnstilev1.AgentEvent
	for {
		resp, err := w.Recv()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, resp.GetEvent())
	}
}

// roundAll rounds each of ds to the millisecond.
func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
