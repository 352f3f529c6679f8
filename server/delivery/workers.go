package delivery

import (
	"sync"
	"sync/atomic"
)

// Workers runs functions on goroutines that outlive them: each Send of a
// [Stream] runs on one, and each durable run owned here on another
// pool's (package durable). A Send grows its
// goroutine's stack (gRPC's encoding, the protobuf marshaller), and on a
// fresh goroutine per turn every turn paid for that growth again, a copy
// of the stack at each doubling (about 6% of the server's instructions
// per turn under callgrind). A worker that finishes waits for the next
// function, unless maxIdle workers already wait; Close ends the waiting
// ones.
type Workers struct {
	work    chan func()
	quit    chan struct{}
	idle    atomic.Int32
	maxIdle int32
	closed  sync.Once
}

// NewWorkers returns workers that keep at most maxIdle goroutines
// waiting.
func NewWorkers(maxIdle int32) *Workers {
	return &Workers{work: make(chan func()), quit: make(chan struct{}), maxIdle: maxIdle}
}

// Run runs f on a waiting worker, or on a new one if none waits.
func (w *Workers) Run(f func()) {
	select {
	case w.work <- f:
	default:
		go w.loop(f)
	}
}

// Start starts n workers that wait for a function, as gRPC starts its
// stream workers: the goroutines exist from the server's start, not from
// its first turns.
func (w *Workers) Start(n int) {
	for range n {
		go w.loop(nil)
	}
}

// loop runs f, if any, then the functions it is given while it waits.
func (w *Workers) loop(f func()) {
	for {
		if f != nil {
			f()
		}
		if w.idle.Add(1) > w.maxIdle {
			w.idle.Add(-1)
			return
		}
		select {
		case f = <-w.work:
			w.idle.Add(-1)
		case <-w.quit:
			w.idle.Add(-1)
			return
		}
	}
}

// Close ends the waiting workers; a function run later gets a goroutine
// of its own, which ends with it.
func (w *Workers) Close() { w.closed.Do(func() { close(w.quit) }) }
