package engine

import "sync"

// pool applies decoded work on a fixed number of goroutines, for loading
// checkpoints and replaying logs: the reader submits in order, the order
// of application does not matter (highest TID wins), and the first error
// is kept.
type pool struct {
	jobs chan poolJob
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
}

type poolJob struct {
	at   int64 // where the data came from, for errors
	data []byte
}

func startPool(n int, work func(at int64, data []byte) error) *pool {
	p := &pool{jobs: make(chan poolJob, 2*n)}
	for range n {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for j := range p.jobs {
				if err := work(j.at, j.data); err != nil {
					p.mu.Lock()
					if p.err == nil {
						p.err = err
					}
					p.mu.Unlock()
				}
			}
		}()
	}
	return p
}

func (p *pool) submit(at int64, data []byte) { p.jobs <- poolJob{at, data} }

// wait ends the pool and returns the first error of its work.
func (p *pool) wait() error {
	close(p.jobs)
	p.wg.Wait()
	return p.err
}
