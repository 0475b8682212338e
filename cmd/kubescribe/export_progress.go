package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// progress shows the export's progress: one line per resource being listed, with a bar once
// the first page tells how long its list is, and one line per resource done.
type progress interface {
	start(name string) progressBar
	wait()
}

type progressBar interface {
	addTotal(n int64)
	increment()
	done(written int64)
}

// newProgress draws on stderr when it is a terminal (mode auto) or always; otherwise nothing is
// drawn, so logs and pipes stay clean.
func newProgress(ctx context.Context, stderr io.Writer, mode string) progress {
	show := mode == "always"
	if mode == "auto" {
		if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			show = true
		}
	}
	if !show {
		return quietProgress{}
	}
	// WithAutoRefresh makes mpb draw also where it does not see a terminal (--progress always).
	return &barProgress{p: mpb.NewWithContext(ctx, mpb.WithOutput(stderr), mpb.WithWidth(32), mpb.WithAutoRefresh())}
}

type quietProgress struct{}

func (quietProgress) start(string) progressBar { return quietProgress{} }
func (quietProgress) wait()                    {}
func (quietProgress) addTotal(int64)           {}
func (quietProgress) increment()               {}
func (quietProgress) done(int64)               {}

type barProgress struct{ p *mpb.Progress }

func (b *barProgress) start(name string) progressBar {
	bar := b.p.AddBar(0,
		mpb.BarRemoveOnComplete(),
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.CountersNoUnit("%d / %d", decor.WCSyncSpace)),
		mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace)),
	)
	return &oneBar{p: b.p, bar: bar, name: name}
}

func (b *barProgress) wait() { b.p.Wait() }

type oneBar struct {
	p    *mpb.Progress
	bar  *mpb.Bar
	name string

	mu    sync.Mutex // addTotal runs on the pager's goroutine, increment on the writer's
	total int64
	seen  int64
}

// addTotal grows the bar by a list's length (a resource listed in several namespaces has
// several lists).
func (o *oneBar) addTotal(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total += n
	o.bar.SetTotal(o.total, false)
}

func (o *oneBar) increment() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen++
	if o.seen > o.total { // the list grew while it was read
		o.total = o.seen
		o.bar.SetTotal(o.total, false)
	}
	o.bar.Increment()
}

func (o *oneBar) done(written int64) {
	fmt.Fprintf(o.p, "%-56s %d\n", o.name, written)
	o.bar.SetTotal(-1, true)
}
