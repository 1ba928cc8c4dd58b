package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws a progress bar on a terminal (redrawn in place) or, when
// the output is not a terminal, prints a plain line at every quarter.
type progress struct {
	out *os.File
	tty bool

	mu      sync.Mutex
	name    string
	total   int64
	began   time.Time
	stop    chan struct{}
	stopped chan struct{}
	done    atomic.Int64
	shown   int64 // plain mode: the last quarter printed
}

func newProgress(out *os.File) *progress {
	fi, err := out.Stat()
	tty := err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
	return &progress{out: out, tty: tty}
}

// start begins a bar for one run of total products: the bar counts the
// products done, scraped or given up (the table then tells them apart).
func (p *progress) start(name string, total int) {
	p.mu.Lock()
	p.name, p.total, p.began, p.shown = name, int64(total), time.Now(), 0
	p.done.Store(0)
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	p.mu.Unlock()
	go p.loop()
}

// add counts n products settled.
func (p *progress) add(n int) { p.done.Add(int64(n)) }

// finish stops the bar and leaves its last state on a line of its own.
func (p *progress) finish() {
	p.mu.Lock()
	stop := p.stop
	p.stop = nil
	p.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-p.stopped
	p.draw(true)
}

func (p *progress) loop() {
	defer close(p.stopped)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			p.draw(false)
		}
	}
}

func (p *progress) draw(last bool) {
	done := min(p.done.Load(), p.total)
	frac := float64(done) / float64(max(p.total, 1))
	took := time.Since(p.began).Round(100 * time.Millisecond)
	if !p.tty {
		if q := int64(frac * 4); q > p.shown || last {
			p.shown = q
			fmt.Fprintf(p.out, "%-22s %3.0f%%  %d/%d products done (scraped or given up)  %v\n", p.name, 100*frac, done, p.total, took)
		}
		return
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("=", n) + strings.Repeat(" ", width-n)
	fmt.Fprintf(p.out, "\r%-22s [%s] %3.0f%%  %d/%d products done (scraped or given up)  %v ", p.name, bar, 100*frac, done, p.total, took)
	if last {
		fmt.Fprintln(p.out)
	}
}
