package server

import (
	"sync"
	"sync/atomic"
)

// workers runs functions on goroutines that outlive them: each Send of a
// stream's [pacer] runs on one, and each durable run owned
// here ([service.own]) on another pool's. A Send grows its
// goroutine's stack (gRPC's encoding, the protobuf marshaller), and on a
// fresh goroutine per turn every turn paid for that growth again, a copy
// of the stack at each doubling (about 6% of the server's instructions
// per turn under callgrind). A worker that finishes waits for the next
// function, unless maxIdle workers already wait; close ends the waiting
// ones.
type workers struct {
	work    chan func()
	quit    chan struct{}
	idle    atomic.Int32
	maxIdle int32
	closed  sync.Once
}

// newWorkers returns workers that keep at most maxIdle goroutines waiting.
func newWorkers(maxIdle int32) *workers {
	return &workers{work: make(chan func()), quit: make(chan struct{}), maxIdle: maxIdle}
}

// run runs f on a waiting worker, or on a new one if none waits.
func (w *workers) run(f func()) {
	select {
	case w.work <- f:
	default:
		go w.loop(f)
	}
}

// start starts n workers that wait for a function, as gRPC starts its
// stream workers: the goroutines exist from the server's start, not from
// its first turns.
func (w *workers) start(n int) {
	for range n {
		go w.loop(nil)
	}
}

// loop runs f, if any, then the functions it is given while it waits.
func (w *workers) loop(f func()) {
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

// close ends the waiting workers; a function run later gets a goroutine
// of its own, which ends with it.
func (w *workers) close() { w.closed.Do(func() { close(w.quit) }) }
