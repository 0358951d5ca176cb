package engine

import "sync"

// pool applies decoded work on a fixed number of goroutines, for loading
// checkpoints and replaying logs: the reader submits in order, the order
// of application does not matter (highest TID wins), and the first error
// is kept.
type pool struct {
	jobs chan poolJob
	wg   sync.WaitGroup // the workers
	busy sync.WaitGroup // the jobs submitted and not yet done
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
				p.busy.Done()
			}
		}()
	}
	return p
}

func (p *pool) submit(at int64, data []byte) {
	p.busy.Add(1)
	p.jobs <- poolJob{at, data}
}

// drain waits until every job submitted is done, and returns the first
// error of any so far; the pool stays open.
func (p *pool) drain() error {
	p.busy.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// wait ends the pool and returns the first error of its work.
func (p *pool) wait() error {
	close(p.jobs)
	p.wg.Wait()
	return p.err
}
