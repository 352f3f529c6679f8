package server_test

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/fake"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/server"
	"github.com/turnstile-dev/turnstile/store"
)

// flow is a provider whose turns ("flow:NAME") stream text until NAME is
// released, then answer "done": a KiB every few milliseconds, or, once
// NAME is hurried, 16 KiB chunks as fast as they are taken.
type flow struct {
	calls   atomic.Int64
	mu      sync.Mutex
	release map[string]chan struct{}
	hurry   map[string]*atomic.Bool
}

func newFlow() *flow {
	return &flow{release: map[string]chan struct{}{}, hurry: map[string]*atomic.Bool{}}
}

func (f *flow) of(name string) (chan struct{}, *atomic.Bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.release[name]; !ok {
		f.release[name], f.hurry[name] = make(chan struct{}), new(atomic.Bool)
	}
	return f.release[name], f.hurry[name]
}

func (f *flow) Stream(ctx context.Context, req *llm.Request) iter.Seq2[llm.Chunk, error] {
	f.calls.Add(1)
	name := strings.TrimPrefix(req.Messages[0].Parts[0].Text, "flow:")
	release, hurry := f.of(name)
	return func(yield func(llm.Chunk, error) bool) {
		slow, fast := strings.Repeat("a", 1<<10), strings.Repeat("b", 16<<10)
		tick := time.NewTicker(4 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-release:
				for _, c := range fake.Text("done") {
					if !yield(c, nil) {
						return
					}
				}
				return
			case <-ctx.Done():
				yield(llm.Chunk{}, ctx.Err())
				return
			default:
			}
			text := slow
			if hurry.Load() {
				text = fast
			} else {
				select {
				case <-tick.C:
				case <-ctx.Done():
					yield(llm.Chunk{}, ctx.Err())
					return
				case <-release:
					continue
				}
			}
			if !yield(llm.Chunk{Kind: llm.ChunkText, Text: text}, nil) {
				return
			}
		}
	}
}

// flowing is a turn a client reads to its end.
type flowing struct {
	name string
	seen atomic.Int64 // events received
	evs  []*turnstilev1.AgentEvent
	st   *status.Status
	done chan struct{}
}

// TestDiskFillsUnderRunningTurns fills the disk under the embedded file
// store to its last byte (a 64 MiB tmpfs, dd) while 8 turns stream, and
// holds what each client sees to what the log says afterwards:
//
//   - the turns go on in the reserve, new turns are refused STORE_FULL;
//     those that end complete, each client receiving turn_completed;
//   - the others, writing on until the reserve is spent, end with a
//     stored error STORE_FULL (RESOURCE_EXHAUSTED, retryable), which their
//     clients receive;
//   - the log of every turn equals what its client received, with one
//     terminal event, and stays so once space returns (no turn a client
//     was told failed is resumed); new turns run again without a restart.
//
// It needs root to mount the tmpfs, and is skipped otherwise.
func TestDiskFillsUnderRunningTurns(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	logs := &syncBuffer{}
	st := openStore(t, inDir(filepath.Join(mnt, "js")), withLeaseTTL(500*time.Millisecond),
		withConfig(func(c *store.Config) { c.MaxBytes, c.Reserve = 24<<20, 16<<20 }),
		withLogger(slog.New(slog.NewTextHandler(logs, nil))))
	defer func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("store log:\n%s", logs.String())
		}
	}()
	f := newFlow()
	ts := start(t, runner(t, f), server.Options{Store: st, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	st.OnRoom(ts.srv.StoreRoom)

	var turns []*flowing
	for i := range 8 {
		ft := &flowing{name: fmt.Sprintf("t%d", i), done: make(chan struct{})}
		turns = append(turns, ft)
		go func() {
			defer close(ft.done)
			ft.evs, ft.st = wiretest.Collect(t, t.Context(), ts.client, sized(ft.name, "flow:"+ft.name, 0), func(*turnstilev1.AgentEvent) { ft.seen.Add(1) })
		}()
	}
	// progress waits until each turn of ts received n more events.
	progress := func(what string, ts []*flowing, n int64) {
		t.Helper()
		from := make([]int64, len(ts))
		for i, ft := range ts {
			from[i] = ft.seen.Load()
		}
		eventually(t, what, func() bool {
			for i, ft := range ts {
				if ft.seen.Load() < from[i]+n {
					return false
				}
			}
			return true
		})
	}
	progress("the turns to stream", turns, 5)

	// Something else fills the disk to its last byte.
	fill := filepath.Join(mnt, "fill")
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+fill, "bs=1M").CombinedOutput(); err == nil {
		t.Fatalf("dd filled no disk: %s", out)
	}
	// The running turns go on, in the reserve; new turns are refused.
	progress("the turns to stream on the full disk", turns, 20)
	_, refused := wiretest.Collect(t, t.Context(), ts.client, sized("new-on-full-disk", "flow:new", 0), nil)
	storeFullStatus(t, refused)

	// Half of them end: they complete.
	for _, ft := range turns[:4] {
		release, _ := f.of(ft.name)
		close(release)
	}
	for _, ft := range turns[:4] {
		<-ft.done
		if ft.st.Code() != codes.OK || ft.evs[len(ft.evs)-1].GetTurnCompleted() == nil {
			t.Fatalf("%s ended %v after %s, want turn_completed", ft.name, ft.st, wiretest.Names(ft.evs))
		}
	}
	// The others write on, fast, until the reserve is spent: they end
	// with a stored STORE_FULL error.
	for _, ft := range turns[4:] {
		_, hurry := f.of(ft.name)
		hurry.Store(true)
	}
	for _, ft := range turns[4:] {
		<-ft.done
		last := ft.evs[len(ft.evs)-1].GetError()
		if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_STORE_FULL || !last.GetRetryable() {
			t.Fatalf("%s ended %v after %s, its last error %v; want a retryable STORE_FULL error", ft.name, ft.st, wiretest.Names(ft.evs), last)
		}
		if ft.st.Code() != codes.ResourceExhausted || reasonOf(ft.st) != server.ReasonStoreFull {
			t.Errorf("%s's status: %v, want RESOURCE_EXHAUSTED STORE_FULL", ft.name, ft.st)
		}
	}
	if !strings.Contains(logs.String(), "filled past the reserve") {
		t.Errorf("the store never said the reserve was spent")
	}

	// Every log is what its client received, one terminal event last.
	sameLogs := func(when string) {
		t.Helper()
		for _, ft := range turns {
			log, lst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: ft.name})
			sameEvents(t, when+": "+ft.name+"'s log", log, ft.evs)
			sameStatus(t, when+": "+ft.name+"'s watch", lst, ft.st)
			for _, ev := range log[:len(log)-1] {
				if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
					t.Fatalf("%s: %s's log has a terminal event at seq %d of %d", when, ft.name, ev.GetSeq(), len(log))
				}
			}
		}
	}
	sameLogs("on the full disk")

	// Space returns: new turns run again, without a restart, and the logs
	// are as they were (no turn was taken over and finished).
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	waitServing(t, ts)
	release, _ := f.of("after")
	close(release)
	evs, after := wiretest.Collect(t, t.Context(), ts.client, sized("after", "flow:after", 0), nil)
	if after.Code() != codes.OK {
		t.Fatalf("a turn after space returned: %v (%s)", after, wiretest.Names(evs))
	}
	sameLogs("once space returned")
	if n := f.calls.Load(); n != 9 {
		t.Errorf("model calls: %d, want 9 (each turn's one, and the one after): a turn was run again", n)
	}
}

// TestDiskFullWithoutReserve: with store.reserve 0 nothing is held back,
// so when the disk fills to its last byte under a running turn, the turn
// is ended but its STORE_FULL error cannot be stored: its client's stream
// ends UNAVAILABLE, saying to watch the turn again. Once space returns the
// error is stored, and watching the turn replays it as its last event: the
// turn is not taken over and finished. It needs root to mount the tmpfs,
// and is skipped otherwise.
func TestDiskFullWithoutReserve(t *testing.T) {
	t.Parallel()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	logs := &syncBuffer{}
	st := openStore(t, inDir(filepath.Join(mnt, "js")), withLeaseTTL(500*time.Millisecond),
		withConfig(func(c *store.Config) { c.MaxBytes, c.Reserve = 24<<20, 0 }),
		withLogger(slog.New(slog.NewTextHandler(logs, nil))))
	defer func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("store log:\n%s", logs.String())
		}
	}()
	f := newFlow()
	ts := start(t, runner(t, f), server.Options{Store: st, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	st.OnRoom(ts.srv.StoreRoom)

	ft := &flowing{name: "t0", done: make(chan struct{})}
	go func() {
		defer close(ft.done)
		ft.evs, ft.st = wiretest.Collect(t, t.Context(), ts.client, sized(ft.name, "flow:"+ft.name, 0), func(*turnstilev1.AgentEvent) { ft.seen.Add(1) })
	}()
	eventually(t, "the turn to stream", func() bool { return ft.seen.Load() >= 5 })
	fill := filepath.Join(mnt, "fill")
	if out, err := exec.Command("dd", "if=/dev/zero", "of="+fill, "bs=1M").CombinedOutput(); err == nil {
		t.Fatalf("dd filled no disk: %s", out)
	}
	// The turn ends; its last event has no room: its client is told to
	// watch it again (after the store's bound on a write, 30 s).
	<-ft.done
	if ft.st.Code() != codes.Unavailable || !strings.Contains(ft.st.Message(), "watch the turn again") {
		t.Fatalf("the turn ended %v after %s; want UNAVAILABLE saying to watch it again", ft.st, wiretest.Names(ft.evs))
	}
	for _, ev := range ft.evs {
		if ev.GetError() != nil || ev.GetTurnCompleted() != nil {
			t.Fatalf("the client received a terminal event at seq %d: %v", ev.GetSeq(), ev)
		}
	}
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	waitServing(t, ts)
	// Its end is stored now: the stream it was given, then STORE_FULL.
	eventually(t, "the turn's STORE_FULL error in the log", func() bool {
		log, _ := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: ft.name})
		return len(log) > 0 && log[len(log)-1].GetError() != nil
	})
	log, lst := watch(t, t.Context(), ts.client, &turnstilev1.WatchTurnRequest{TurnId: ft.name})
	sameEvents(t, "the log before its end", log[:len(ft.evs)], ft.evs)
	if len(log) != len(ft.evs)+1 {
		t.Fatalf("the log holds %d events after the %d its client received: %s", len(log)-len(ft.evs), len(ft.evs), wiretest.Names(log))
	}
	last := log[len(log)-1].GetError()
	if last.GetCode() != turnstilev1.ErrorCode_ERROR_CODE_STORE_FULL || !last.GetRetryable() || lst.Code() != codes.ResourceExhausted || reasonOf(lst) != server.ReasonStoreFull {
		t.Errorf("the log ends with %v, the watch with %v; want a retryable STORE_FULL error, RESOURCE_EXHAUSTED STORE_FULL", last, lst)
	}
	if f.calls.Load() != 1 {
		t.Errorf("model calls: %d, want 1 (the turn was not taken over)", f.calls.Load())
	}
}
