package delivery

import (
	"sync"
	"testing"
)

// TestWorkers checks that every function runs, all at once when they
// block, before and after close, with workers started ahead or not;
// goleak (TestMain) checks that Close ends the waiting workers.
func TestWorkers(t *testing.T) {
	t.Parallel()
	for _, maxIdle := range []int32{0, 2, 64} {
		w := NewWorkers(maxIdle)
		w.Start(int(maxIdle))
		for round := range 3 {
			const n = 10
			var started, done sync.WaitGroup
			started.Add(n)
			done.Add(n)
			release := make(chan struct{})
			for range n {
				w.Run(func() {
					defer done.Done()
					started.Done()
					<-release
				})
			}
			// Every function runs while the others block: none waits for
			// a worker.
			started.Wait()
			close(release)
			done.Wait()
			if round == 1 {
				w.Close()
				w.Close() // twice is fine
			}
		}
	}
}
