package bench

import (
	"fmt"
	"io"
	"time"
)

// Write prints r as Markdown: the latency and cost table, memory, and
// each target of issue #13 with whether it was met.
func (r *Report) Write(w io.Writer) {
	u := r.Config.Upstream
	fmt.Fprintf(w, "upstream: %d chunks of %d bytes, %v apart; %d sequential turns, %d turns at concurrency %d over %d connection(s)\n\n",
		u.Chunks, u.ChunkSize, u.Delay, r.Config.Turns, r.Config.ConcurrentTurns, r.Config.Concurrency, r.Config.Conns)
	fmt.Fprintln(w, "| | turns/s | first delta p50 / p99 | total p50 / p99 | server CPU per turn | allocs per turn | KB per turn | errors |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	row := func(label string, p Phase) {
		cost := "—"
		allocs, kb := "—", "—"
		if p.CPUPerTurn > 0 || p.AllocsPerTurn > 0 {
			cost = ms(p.CPUPerTurn)
			allocs = fmt.Sprintf("%.0f", p.AllocsPerTurn)
			kb = fmt.Sprintf("%.1f", p.BytesPerTurn/1024)
		}
		fmt.Fprintf(w, "| %s | %.0f | %s / %s | %s / %s | %s | %s | %s | %d |\n", label, p.TurnsPerSec,
			ms(p.FirstDeltaP50), ms(p.FirstDeltaP99), ms(p.TotalP50), ms(p.TotalP99), cost, allocs, kb, p.Errors)
	}
	added := func(label string, d, s Phase) {
		fmt.Fprintf(w, "| %s | ×%.2f | %s / %s | %s / %s | | | | |\n", label, ratio(s.TurnsPerSec, d.TurnsPerSec),
			ms(s.FirstDeltaP50-d.FirstDeltaP50), ms(s.FirstDeltaP99-d.FirstDeltaP99),
			ms(s.TotalP50-d.TotalP50), ms(s.TotalP99-d.TotalP99))
	}
	row("direct, sequential", r.DirectSeq)
	row("turnstile, sequential", r.ServerSeq)
	added("added (turnstile − direct)", r.DirectSeq, r.ServerSeq)
	c := r.Config.Concurrency
	row(fmt.Sprintf("direct, c=%d", c), r.DirectConc)
	row(fmt.Sprintf("turnstile, c=%d", c), r.ServerConc)
	added("added (turnstile − direct)", r.DirectConc, r.ServerConc)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "server memory: idle RSS %s at start, %s after the load; peak RSS %s; GC cycles %d (sequential), %d (c=%d)\n",
		mib(r.IdleRSS), mib(r.IdleRSSAfter), mib(r.PeakRSS), r.ServerSeq.GCCycles, r.ServerConc.GCCycles, c)
	if r.Config.Callgrind {
		fmt.Fprintf(w, "server instructions per turn (callgrind): %.0f sequential, %.0f at c=%d\n",
			r.ServerSeq.InstructionsPerTurn, r.ServerConc.InstructionsPerTurn, c)
	}
	for _, p := range []Phase{r.DirectSeq, r.DirectConc, r.ServerSeq, r.ServerConc, r.FastUnderSlow} {
		if p.FirstErr != "" {
			fmt.Fprintf(w, "first error of %s (c=%d): %s\n", p.Name, p.Concurrency, p.FirstErr)
		}
	}
	if r.Slow > 0 {
		fmt.Fprintf(w, "slow turns: %d held open (%d streaming when measured): RSS %s, %s KiB per turn\n",
			r.Slow, r.SlowOpen, mib(r.SlowRSS), kib(r.SlowPerTurn))
		if r.SlowErr != "" {
			fmt.Fprintln(w, r.SlowErr)
		}
		f := r.FastUnderSlow
		fmt.Fprintf(w, "fast turns beside them: first delta p50 / p99 / max %s / %s / %s, total p99 %s (alone: first delta p99 %s, total p99 %s); %d errors\n",
			ms(f.FirstDeltaP50), ms(f.FirstDeltaP99), ms(f.FirstDeltaMax), ms(f.TotalP99), ms(r.ServerSeq.FirstDeltaP99), ms(r.ServerSeq.TotalP99), f.Errors)
	}
	fmt.Fprintln(w)
	r.writeTargets(w)
}

// writeTargets lists the targets of issue #13 against the measurements.
func (r *Report) writeTargets(w io.Writer) {
	type target struct {
		what string
		got  string
		met  bool
	}
	s, c := r.ServerSeq, r.ServerConc
	addP50 := s.FirstDeltaP50 - r.DirectSeq.FirstDeltaP50
	addP99 := s.FirstDeltaP99 - r.DirectSeq.FirstDeltaP99
	ts := []target{
		{"added time to first delta p50 ≤ 0.3 ms (sequential)", ms(addP50), addP50 <= 300*time.Microsecond},
		{"added time to first delta p99 ≤ 1.5 ms (sequential)", ms(addP99), addP99 <= 1500*time.Microsecond},
		{"server CPU per turn ≤ 0.7 ms (sequential)", ms(s.CPUPerTurn), s.CPUPerTurn <= 700*time.Microsecond},
		{fmt.Sprintf("server CPU per turn ≤ 0.5 ms (c=%d)", c.Concurrency), ms(c.CPUPerTurn), c.CPUPerTurn <= 500*time.Microsecond},
		{fmt.Sprintf("≥ 1,500 turns/s at c=%d, 0 errors", c.Concurrency), fmt.Sprintf("%.0f, %d errors", c.TurnsPerSec, c.Errors), c.TurnsPerSec >= 1500 && c.Errors == 0},
		{"idle RSS ≤ 30 MiB", mib(r.IdleRSS), r.IdleRSS <= 30<<20},
	}
	if r.Slow > 0 {
		delay := r.FastUnderSlow.FirstDeltaP99 - s.FirstDeltaP99
		ts = append(ts,
			target{fmt.Sprintf("%d slow turns at ≤ 40 KiB each", r.Slow), kib(r.SlowPerTurn) + " KiB", r.SlowOpen == r.Slow && r.SlowPerTurn <= 40<<10},
			target{"fast turns beside them delayed ≤ 1 ms (first delta p99)", ms(delay), delay <= time.Millisecond && r.FastUnderSlow.Errors == 0},
		)
	}
	fmt.Fprintln(w, "| target | measured | met |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, t := range ts {
		met := "no"
		if t.met {
			met = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", t.what, t.got, met)
	}
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/1e6)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func kib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<10)) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
