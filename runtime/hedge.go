package runtime

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/turnstile-dev/turnstile/llm"
)

// errHedgeLost is the cause of a call cancelled because the other call of
// its hedged pair answered first.
var errHedgeLost = errors.New("runtime: the hedged call answered first")

// racer is one call of a hedged pair, its provider stream read on a
// goroutine of its own so the turn can wait for either call.
type racer struct {
	c     *call
	items chan item // closed when the stream ends
	// buf holds what the call yielded before the race was decided.
	buf    []llm.Chunk
	failed bool // the call failed before it answered, and was closed
}

// item is one yield of a provider stream, with when it came.
type item struct {
	c   llm.Chunk
	err error
	at  time.Duration // since the call started
}

// spawn starts reading c's stream on a goroutine. The goroutine ends when
// the stream does or c.cancel is called; [racer.drain] waits for it.
func spawn(c *call) *racer {
	actx, cancel := context.WithCancelCause(c.actx)
	c.cancel = cancel
	c.wd = newWatchdog(c.m.FirstTokenTimeout, c.m.IdleTimeout, cancel)
	r := &racer{c: c, items: make(chan item, 8)}
	go func() {
		defer close(r.items)
		for ch, err := range c.m.Provider.Stream(actx, c.req) {
			if err == nil {
				c.wd.chunk()
			}
			select {
			case r.items <- item{c: ch, err: err, at: time.Since(c.start)}:
			case <-actx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return r
}

// drain cancels the call when cause is not nil, then reads its stream to
// the end, keeping the usage it reports, so its goroutine has ended when
// drain returns.
func (r *racer) drain(cause error) {
	if cause != nil {
		r.c.cancel(cause)
	}
	for it := range r.items {
		if it.err == nil && it.c.Kind == llm.ChunkUsage {
			r.c.res.usage = it.c.Usage
		}
	}
}

// rest returns the call's stream from where the race left it: the chunks
// buffered, then what the goroutine still reads.
func (r *racer) rest() iter.Seq2[llm.Chunk, error] {
	return func(yield func(llm.Chunk, error) bool) {
		for _, c := range r.buf {
			if !yield(c, nil) {
				return
			}
		}
		for it := range r.items {
			if !yield(it.c, it.err) {
				return
			}
		}
	}
}

// answers reports whether c ends the race: output, or the reply's end.
func answers(c llm.Chunk) bool {
	switch c.Kind {
	case llm.ChunkText, llm.ChunkThinking, llm.ChunkToolCallStart, llm.ChunkToolCallArgs, llm.ChunkStop:
		return true
	}
	return false
}

// race runs primary, a call of a model with a hedge, and, when no output has
// come after delay, a hedged call of the same request (see [modelCalls.hedge]).
// The first call to answer wins: the other is cancelled (its usage counted,
// its LLMCallFinished emitted before any output) and only the winner's
// output is streamed, so deltas of the two never interleave. A call that
// fails before answering is closed and the other goes on alone; when both
// fail, the result is the primary's failure, for the step to decide on.
func (mc *modelCalls) race(ctx context.Context, primary *call, delay time.Duration) attemptResult {
	p := spawn(primary)
	timer := time.NewTimer(delay)
	defer timer.Stop()
	var h *racer
	pItems, hItems := p.items, (chan item)(nil) // nil once a call is out of the race
	for {
		var r *racer
		var it item
		var open bool
		select {
		case it, open = <-pItems:
			r = p
		case it, open = <-hItems:
			r = h
		case <-timer.C:
			if h = mc.hedge(ctx, primary, delay); h != nil {
				hItems = h.items
			}
			continue
		}
		if open && it.err == nil && r.c.res.ttfc == 0 {
			mc.firstChunk(r.c, it.at)
		}
		switch {
		case open && it.err == nil && answers(it.c):
			r.buf = append(r.buf, it.c)
			r.c.answeredAt = max(it.at, 1)
			return mc.win(ctx, r, p, h)
		case open && it.err == nil:
			r.buf = append(r.buf, it.c)
			if it.c.Kind == llm.ChunkUsage {
				r.c.res.usage = it.c.Usage
			}
			continue
		}
		// r failed before it answered: an error, or the end of its stream.
		r.c.res.err = mc.classify(ctx, r.c.m, it.err, false, r.c.wd)
		r.drain(nil)
		r.failed = true
		mc.close(ctx, r.c)
		if other := pair(r, p, h); other == nil || other.failed {
			res := p.c.res
			if h != nil && h.c.m == p.c.m {
				// The hedge took an attempt on the model: count on from it.
				res.number = h.c.info.Attempt
			}
			return res
		}
		if r == p {
			pItems = nil
		} else {
			hItems = nil
		}
	}
}

// pair returns the other call of r's pair, nil when there is none.
func pair(r, p, h *racer) *racer {
	if r == p {
		return h
	}
	return p
}

// win streams the winner r of the race between p and h: it cancels and
// closes the other call, then streams r's output and closes r.
func (mc *modelCalls) win(ctx context.Context, r, p, h *racer) attemptResult {
	if other := pair(r, p, h); other != nil && !other.failed {
		other.drain(errHedgeLost)
		other.c.lost = true
		other.c.res.err = &llm.Error{
			Kind: llm.KindCancelled, Model: other.c.m.Alias, Provider: other.c.m.ProviderName,
			Message: "cancelled: the hedged call to " + r.c.m.Alias + " answered first",
		}
		mc.close(ctx, other.c)
	}
	mc.stream(ctx, r.c, r.rest(), false)
	r.drain(context.Canceled) // the stream ended, or the turn stopped reading it
	mc.close(ctx, r.c)
	res := r.c.res
	if r == h && p.c.m == h.c.m {
		res.number = h.c.info.Attempt
	}
	return res
}

// hedge starts the hedged call of primary, delay after it began, unless the
// target is cooling down, the target's retry budget has no token, or the
// turn has no model call left. It emits Hedge and the call's
// LLMCallStarted, and returns the racing call, nil when none started.
func (mc *modelCalls) hedge(ctx context.Context, primary *call, delay time.Duration) *racer {
	m := primary.m
	target, number := m, primary.info.Attempt+1
	switch m.Hedge.target() {
	case HedgeNext:
		i := mc.t.chain.next()
		if i < 0 {
			return nil
		}
		target, number = mc.t.r.routers[mc.t.chain.models[i].Alias].healthiest(mc.t.r.health, nil), 1
	case HedgeDeployment:
		target = mc.t.r.routers[m.Alias].healthiest(mc.t.r.health, func(d *Model) bool { return d == m })
	}
	if target == nil || mc.t.stopped(ctx) != nil || mc.t.counters.ModelCalls >= mc.t.maxCalls || !mc.t.r.health.Healthy(target.healthKey()) {
		return nil
	}
	ticket, ok := mc.t.r.health.Reserve(target.healthKey())
	if !ok {
		return nil
	}
	mc.t.counters.Hedges++
	mc.t.out.emit(ctx, &Hedge{From: m.Alias, To: target.Alias, After: delay, ToDeployment: target.Deployment})
	c := mc.open(ctx, target, number, ticket, AttemptInfo{HedgeFrom: m.Alias, HedgeAfter: delay})
	return spawn(c)
}

// hedgeDelay returns how long a call of m may go without output before it
// is hedged, and false when it must not be (a quantile delay with too few
// samples yet).
func (mc *modelCalls) hedgeDelay(m *Model) (time.Duration, bool) {
	d := m.Hedge.After
	if d.quantile == 0 {
		return d.fixed, true
	}
	return mc.t.r.latencies[m.healthKey()].quantile(d.quantile)
}

// recordLatency adds the time c took to answer (its first output) to its
// model's samples, when the model hedges at a quantile. A call cancelled by
// its hedge counts as the time it ran: its answer would have come later
// still.
func (mc *modelCalls) recordLatency(c *call) {
	l := mc.t.r.latencies[c.m.healthKey()]
	switch {
	case l == nil:
	case c.answeredAt > 0:
		l.add(c.answeredAt)
	case c.lost:
		l.add(c.res.duration)
	}
}
