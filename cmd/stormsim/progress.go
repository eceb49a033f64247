package main

import (
	"fmt"
	"io"
	"sync"

	"github.com/schollz/progressbar/v3"
)

// bar is the live progress line of the demo: which mode and phase, and
// the counts so far. Its steps are the phases of all modes.
type bar struct {
	mu                sync.Mutex
	b                 *progressbar.ProgressBar
	step              int
	curMode, curPhase string
}

func newBar(w io.Writer, modes int) *bar { return newBarSteps(w, modes*4) }

// newBarSteps is a bar of steps phases.
func newBarSteps(w io.Writer, steps int) *bar {
	return &bar{b: progressbar.NewOptions(steps,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(10),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true),
	)}
}

func (b *bar) phase(mode, phase string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.curMode != "" {
		b.step++
		_ = b.b.Set(b.step)
	}
	b.curMode, b.curPhase = mode, phase
	b.b.Describe(fmt.Sprintf("%-10s %-9s", mode, phase))
}

func (b *bar) update(requests, ok, paymentCalls int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Describe(fmt.Sprintf("%-10s %-9s req %5d ok %5d payment %6d", b.curMode, b.curPhase, requests, ok, paymentCalls))
}

func (b *bar) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.b.Finish()
}
