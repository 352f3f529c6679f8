package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Write prints r as Markdown: the latency and cost table, memory, and
// each target of issues #13 and #26 with whether it was met.
func (r *Report) Write(w io.Writer) {
	u := r.Config.Upstream
	fmt.Fprintf(w, "upstream: %s, %d chunks of %d bytes, %v apart; %d sequential turns, %d turns at concurrency %d over %d connection(s) per server\n\n",
		u.Mode(), u.Chunks, u.ChunkSize, u.Delay, r.Config.Turns, r.Config.ConcurrentTurns, r.Config.Concurrency, r.Config.Conns)
	if r.Config.FrameInterval != "" {
		fmt.Fprintf(w, "store.frame_interval: %s\n\n", r.Config.FrameInterval)
	}
	fmt.Fprintf(w, "upstream requests: %d, %d of them over HTTP/2\n\n", r.UpstreamRequests, r.UpstreamHTTP2)
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
		fmt.Fprintf(w, "| %s | %s | %s / %s | %s / %s | %s | %s | %s | %d |\n", label, perSec(p.TurnsPerSec),
			ms(p.FirstDeltaP50), ms(p.FirstDeltaP99), ms(p.TotalP50), ms(p.TotalP99), cost, allocs, kb, p.Errors)
	}
	added := func(label string, d, s Phase) {
		fmt.Fprintf(w, "| %s | ×%.2f | %s / %s | %s / %s | | | | |\n", label, ratio(s.TurnsPerSec, d.TurnsPerSec),
			ms(s.FirstDeltaP50-d.FirstDeltaP50), ms(s.FirstDeltaP99-d.FirstDeltaP99),
			ms(s.TotalP50-d.TotalP50), ms(s.TotalP99-d.TotalP99))
	}
	c := r.Config.Concurrency
	row("direct, sequential", r.DirectSeq)
	for _, s := range r.Servers {
		row("turnstile, sequential, store "+s.Store, s.ServerSeq)
		added("added (turnstile − direct)", r.DirectSeq, s.ServerSeq)
	}
	row(fmt.Sprintf("direct, c=%d", c), r.DirectConc)
	for _, s := range r.Servers {
		row(fmt.Sprintf("turnstile, c=%d, store %s", c, s.Store), s.ServerConc)
		added("added (turnstile − direct)", r.DirectConc, s.ServerConc)
	}
	fmt.Fprintln(w)
	for _, s := range r.Servers {
		fmt.Fprintf(w, "store %s: idle RSS %s at start, %s after the load; peak RSS %s; GC cycles %d (sequential), %d (c=%d)\n",
			s.Store, mib(s.IdleRSS), mib(s.IdleRSSAfter), mib(s.PeakRSS), s.ServerSeq.GCCycles, s.ServerConc.GCCycles, c)
		if r.Config.Callgrind {
			fmt.Fprintf(w, "store %s: server instructions per turn (callgrind): %.0f sequential, %.0f at c=%d\n",
				s.Store, s.ServerSeq.InstructionsPerTurn, s.ServerConc.InstructionsPerTurn, c)
		}
		for _, p := range []struct {
			label string
			Phase
		}{{"sequential", s.ServerSeq}, {fmt.Sprintf("c=%d", c), s.ServerConc}} {
			fmt.Fprintf(w, "store %s, %s: CPU per turn by process: %s; the bench's own (client and upstream) %s; stored messages per turn %s\n",
				s.Store, p.label, processes(p.Phase), ms(p.BenchCPUPerTurn), stored(p.Phase))
			if p.NATSInPerTurn > 0 {
				fmt.Fprintf(w, "store %s, %s: NATS messages per turn, summed over its servers: %.1f in, %.1f out\n",
					s.Store, p.label, p.NATSInPerTurn, p.NATSOutPerTurn)
			}
		}
		for _, p := range []Phase{s.ServerSeq, s.ServerConc, s.FastUnderSlow} {
			if p.FirstErr != "" {
				fmt.Fprintf(w, "store %s: first error of %s (c=%d): %s\n", s.Store, p.Name, p.Concurrency, p.FirstErr)
			}
		}
		if s.Slow > 0 {
			fmt.Fprintf(w, "store %s: slow turns: %d held open (%d streaming when measured), upstream %s: RSS %s, %s KiB per turn\n",
				s.Store, s.Slow, s.SlowOpen, u.Mode(), mib(s.SlowRSS), kib(s.SlowPerTurn))
			if s.SlowHeapPerTurn != 0 || s.SlowStackPerTurn != 0 {
				fmt.Fprintf(w, "store %s: of which, per slow turn: heap in use %s KiB, goroutine stacks %s KiB\n",
					s.Store, kib(s.SlowHeapPerTurn), kib(s.SlowStackPerTurn))
			}
			if s.SlowErr != "" {
				fmt.Fprintln(w, s.SlowErr)
			}
			f := s.FastUnderSlow
			fmt.Fprintf(w, "store %s: fast turns beside them: first delta p50 / p99 / max %s / %s / %s, total p99 %s (alone: first delta p99 %s, total p99 %s); %d errors\n",
				s.Store, ms(f.FirstDeltaP50), ms(f.FirstDeltaP99), ms(f.FirstDeltaMax), ms(f.TotalP99), ms(s.ServerSeq.FirstDeltaP99), ms(s.ServerSeq.TotalP99), f.Errors)
		}
	}
	for _, p := range []Phase{r.DirectSeq, r.DirectConc} {
		if p.FirstErr != "" {
			fmt.Fprintf(w, "first error of %s (c=%d): %s\n", p.Name, p.Concurrency, p.FirstErr)
		}
	}
	fmt.Fprintln(w)
	r.writeTargets(w)
}

// target is one target of an issue against its measurement.
type target struct {
	what string
	got  string
	met  bool
}

// writeTargets lists the targets of the issues against the measurements:
// with a paced upstream issue #35's, otherwise issue #26's (the store on
// against the store off) and issue #13's (the store off alone); those
// whose measurement is missing are left out.
func (r *Report) writeTargets(w io.Writer) {
	var ts []target
	if r.Config.Upstream.Delay > 0 {
		// A model's pace: issue #35's targets.
		ts = r.pacedTargets()
	} else {
		ts = r.burstTargets()
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

// shapes returns the reports of the store on, off and the cluster shape,
// nil for those not measured.
func (r *Report) shapes() (on, off, cluster *ServerReport) {
	for _, s := range r.Servers {
		switch s.Store {
		case "on":
			on = s
		case "off":
			off = s
		case "cluster":
			cluster = s
		}
	}
	return on, off, cluster
}

// pacedTargets are the targets of issue #35, for chunks that come at a
// model's pace: CPU per turn of every process of a shape against the
// store off, and the messages a turn stores.
func (r *Report) pacedTargets() []target {
	on, off, cluster := r.shapes()
	c := r.Config.Concurrency
	var ts []target
	for _, t := range []struct {
		s     *ServerReport
		name  string
		bound float64
	}{{on, "store on", 1.3}, {cluster, "cluster", 3}} {
		if t.s == nil {
			continue
		}
		if off != nil {
			p, q := t.s.ServerConc, off.ServerConc
			ts = append(ts, target{fmt.Sprintf("%s: CPU per turn of every process of the shape ≤ %.1f × store off (c=%d)", t.name, t.bound, c),
				ms(p.CPUPerTurn) + " vs " + ms(q.CPUPerTurn) + fmt.Sprintf(" (×%.2f)", ratio(float64(p.CPUPerTurn), float64(q.CPUPerTurn))),
				float64(p.CPUPerTurn) <= t.bound*float64(q.CPUPerTurn) && p.Errors == 0})
		}
		ts = append(ts, target{fmt.Sprintf("%s: stored messages per turn ≤ 25 (c=%d)", t.name, c), stored(t.s.ServerConc),
			t.s.ServerConc.StoredPerTurn > 0 && t.s.ServerConc.StoredPerTurn <= 25})
	}
	return ts
}

// burstTargets are the targets of issue #26 (the store on against the
// store off) and of issue #13 (the store off alone), for replies streamed
// without a pause.
func (r *Report) burstTargets() []target {
	on, off, _ := r.shapes()
	c := r.Config.Concurrency
	var ts []target
	if on != nil && off != nil {
		addOn := on.ServerSeq.FirstDeltaP50 - r.DirectSeq.FirstDeltaP50
		addOff := off.ServerSeq.FirstDeltaP50 - r.DirectSeq.FirstDeltaP50
		addOn99 := on.ServerSeq.FirstDeltaP99 - r.DirectSeq.FirstDeltaP99
		addOff99 := off.ServerSeq.FirstDeltaP99 - r.DirectSeq.FirstDeltaP99
		cpu := func(p, q Phase) target {
			return target{ms(p.CPUPerTurn) + " vs " + ms(q.CPUPerTurn) + fmt.Sprintf(" (×%.2f)", ratio(float64(p.CPUPerTurn), float64(q.CPUPerTurn))), "",
				float64(p.CPUPerTurn) <= 1.2*float64(q.CPUPerTurn)}
		}
		seq, conc := cpu(on.ServerSeq, off.ServerSeq), cpu(on.ServerConc, off.ServerConc)
		ts = append(ts,
			target{"store on: server CPU per turn ≤ 1.2 × store off (sequential)", seq.what, seq.met},
			target{fmt.Sprintf("store on: server CPU per turn ≤ 1.2 × store off (c=%d)", c), conc.what, conc.met},
			target{"store on: added time to first delta p50 ≤ store off + 0.1 ms", ms(addOn) + " vs " + ms(addOff), addOn <= addOff+100*time.Microsecond},
			target{"store on: added time to first delta p99 ≤ store off + 0.1 ms", ms(addOn99) + " vs " + ms(addOff99), addOn99 <= addOff99+100*time.Microsecond},
			target{fmt.Sprintf("store on: turns/s at c=%d ≥ 0.9 × store off, 0 errors", c),
				fmt.Sprintf("%.0f vs %.0f (×%.2f), %d errors", on.ServerConc.TurnsPerSec, off.ServerConc.TurnsPerSec,
					ratio(on.ServerConc.TurnsPerSec, off.ServerConc.TurnsPerSec), on.ServerConc.Errors),
				on.ServerConc.TurnsPerSec >= 0.9*off.ServerConc.TurnsPerSec && on.ServerConc.Errors == 0},
		)
		if r.Config.Callgrind {
			ts = append(ts, target{"store on: instructions per turn ≤ 1.2 × store off (sequential)",
				fmt.Sprintf("%.0f vs %.0f (×%.2f)", on.ServerSeq.InstructionsPerTurn, off.ServerSeq.InstructionsPerTurn,
					ratio(on.ServerSeq.InstructionsPerTurn, off.ServerSeq.InstructionsPerTurn)),
				on.ServerSeq.InstructionsPerTurn <= 1.2*off.ServerSeq.InstructionsPerTurn})
		}
		if on.Slow > 0 && off.Slow > 0 {
			ts = append(ts, target{fmt.Sprintf("store on: memory per held slow turn (%d held, upstream %s) ≤ 1.25 × store off", on.Slow, r.Config.Upstream.Mode()),
				kib(on.SlowPerTurn) + " vs " + kib(off.SlowPerTurn) + " KiB",
				on.SlowOpen == on.Slow && float64(on.SlowPerTurn) <= 1.25*float64(off.SlowPerTurn)})
		}
	}
	if on != nil {
		ts = append(ts, target{"store on: idle RSS ≤ 35 MiB", mib(on.IdleRSS), on.IdleRSS <= 35<<20})
		if on.Slow > 0 {
			f := on.FastUnderSlow
			ts = append(ts, target{"store on: fast turns beside the slow ones, first delta p99 ≤ 3 ms",
				ms(f.FirstDeltaP99) + fmt.Sprintf(" (p50 %s)", ms(f.FirstDeltaP50)), f.FirstDeltaP99 <= 3*time.Millisecond && f.Errors == 0})
		}
	}
	if off != nil {
		s := off.ServerSeq
		add := s.FirstDeltaP50 - r.DirectSeq.FirstDeltaP50
		ts = append(ts,
			target{"store off: added time to first delta p50 ≤ 0.3 ms (sequential)", ms(add), add <= 300*time.Microsecond},
			target{"store off: server CPU per turn ≤ 0.6 ms (sequential)", ms(s.CPUPerTurn), s.CPUPerTurn <= 600*time.Microsecond},
		)
		if off.Slow > 0 {
			ts = append(ts, target{fmt.Sprintf("store off: %d slow turns at ≤ 40 KiB each (upstream %s)", off.Slow, r.Config.Upstream.Mode()), kib(off.SlowPerTurn) + " KiB",
				off.SlowOpen == off.Slow && off.SlowPerTurn <= 40<<10})
		}
	}
	return ts
}

// processes lists a phase's CPU time per turn by process, and their sum.
func processes(p Phase) string {
	var b strings.Builder
	for i, pc := range p.Processes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", pc.Name, ms(pc.CPUPerTurn))
	}
	if len(p.Processes) > 1 {
		fmt.Fprintf(&b, " (sum %s)", ms(p.CPUPerTurn))
	}
	return b.String()
}

// stored is a phase's stored messages per turn, "—" when not measured.
func stored(p Phase) string {
	if p.StoredPerTurn == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", p.StoredPerTurn)
}

// perSec prints a rate of turns: whole above 10 a second, else with a
// decimal (paced turns take seconds each).
func perSec(r float64) string {
	if r < 10 {
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.0f", r)
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
