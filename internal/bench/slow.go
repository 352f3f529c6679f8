package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// slowPhase holds cfg.Slow slow turns open, measures the server's memory
// with them, and runs a sequential phase of fast turns beside them.
func slowPhase(ctx context.Context, cfg Config, srv *child, rep *ServerReport, fast turnFunc, logf func(string, ...any)) error {
	// A connection carries at most max_concurrent_streams (256) streams.
	conns := (cfg.Slow + 199) / 200
	client, closeConns, err := dial([]string{srv.addr}, conns)
	if err != nil {
		return err
	}
	defer closeConns()
	runtimeGC(srv)
	before, err := srv.stats()
	if err != nil {
		return err
	}
	memBefore, memErr := memClasses(srv.ops)
	logf("holding %d slow turns open over %d connections", cfg.Slow, conns)
	sctx, cancel := context.WithCancel(ctx)
	var (
		wg       sync.WaitGroup
		started  = make(chan struct{}, cfg.Slow)
		failed   atomic.Int64
		firstErr atomic.Value
	)
	fail := func(err error) {
		if failed.Add(1) == 1 {
			firstErr.Store(err.Error())
		}
	}
	for range cfg.Slow {
		c := client()
		wg.Go(func() {
			stream, err := c.RunTurn(sctx, &turnstilev1.RunTurnRequest{
				Model: "slow",
				Messages: []*turnstilev1.Message{{
					Role:  turnstilev1.Role_ROLE_USER,
					Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: "hello"}}},
				}},
			})
			if err != nil {
				fail(err)
				return
			}
			signalled := false
			for {
				resp, err := stream.Recv()
				if err != nil {
					if !signalled {
						fail(err)
					}
					return
				}
				if !signalled && resp.GetEvent().GetTextDelta() != nil {
					signalled = true
					started <- struct{}{}
				}
			}
		})
	}
	open := 0
	deadline := time.After(60 * time.Second)
wait:
	for open < cfg.Slow {
		select {
		case <-started:
			open++
		case <-deadline:
			break wait
		}
	}
	rep.Slow, rep.SlowOpen = cfg.Slow, open
	if e, ok := firstErr.Load().(string); ok {
		rep.SlowErr = fmt.Sprintf("%d slow turns failed before streaming; the first: %s", failed.Load(), e)
	}
	logf("%d slow turns streaming; measuring", open)
	runtimeGC(srv)
	with, err := srv.stats()
	memWith, memErr2 := memClasses(srv.ops)
	if memErr == nil && memErr2 == nil && open > 0 {
		rep.SlowHeapPerTurn = (memWith.heapInuse - memBefore.heapInuse) / int64(open)
		rep.SlowStackPerTurn = (memWith.stackInuse - memBefore.stackInuse) / int64(open)
	}
	if cfg.ProfileDir != "" {
		fetchPath(srv.ops, "/debug/pprof/heap", filepath.Join(cfg.ProfileDir, rep.Store+"-slow.heap"))
		fetchPath(srv.ops, "/debug/pprof/goroutine", filepath.Join(cfg.ProfileDir, rep.Store+"-slow.goroutines"))
	}
	if err == nil {
		rep.SlowRSS = with.rss
		if open > 0 {
			rep.SlowPerTurn = (with.rss - before.rss) / int64(open)
		}
		rep.FastUnderSlow = phase("turnstile beside slow turns", drive(ctx, min(cfg.Turns, 1000), 1, fast), 1)
	}
	cancel()
	wg.Wait()
	return err
}
