package busy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Launcher starts tier processes: Path with Args, then the tier's flags.
// A test binary can be its own tier (Args selecting that mode, Env set).
type Launcher struct {
	Path string
	Args []string
	Env  []string // added to the harness's environment
	// Log, if not nil, receives every tier's stderr.
	Log io.Writer
}

// Proc is one running tier process.
type Proc struct {
	Name   string
	Addr   string   // its gRPC address
	stats  string   // the URL of its counters
	flags  []string // as started, for a restart
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has ended
	lines  *lineWriter
	tail   *tailWriter
	once   sync.Once
	err    error
}

// startTimeout bounds how long a tier may take to print its address.
const startTimeout = 20 * time.Second

// Start starts a tier with the given flags and waits until it serves.
func (l Launcher) Start(ctx context.Context, name string, flags ...string) (*Proc, error) {
	cmd := exec.Command(l.Path, append(append([]string{}, l.Args...), flags...)...)
	cmd.Env = append(os.Environ(), l.Env...)
	setParentDeathSignal(cmd)
	p := &Proc{Name: name, flags: flags, cmd: cmd, lines: newLineWriter(), tail: &tailWriter{max: 8 << 10}}
	cmd.Stdout = p.lines
	cmd.Stderr = p.tail
	if l.Log != nil {
		cmd.Stderr = io.MultiWriter(p.tail, l.Log)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		p.err = cmd.Wait()
		close(exited)
	}()
	tctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for p.Addr == "" {
		select {
		case line := <-p.lines.c:
			if s, ok := strings.CutPrefix(line, lineStats); ok {
				p.stats = s
			} else if s, ok := strings.CutPrefix(line, lineAddr); ok {
				p.Addr = s
			}
		case <-exited:
			return nil, fmt.Errorf("%s exited before serving (%v): %s", name, p.err, p.tail)
		case <-tctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			return nil, fmt.Errorf("%s: not serving after %v: %s", name, startTimeout, p.tail)
		}
	}
	return p, nil
}

// Counts reads the tier's counters.
func (p *Proc) Counts(ctx context.Context) (Counts, error) {
	var c Counts
	return c, p.stat(ctx, http.MethodGet, pathCounts, &c)
}

// Arrivals reads the tier's arrivals series.
func (p *Proc) Arrivals(ctx context.Context) (Arrivals, error) {
	var a Arrivals
	return a, p.stat(ctx, http.MethodGet, pathArrivals, &a)
}

// SetFailAll makes the tier answer every request UNAVAILABLE (on) or
// serve again (off), and returns when it switched, on its clock.
func (p *Proc) SetFailAll(ctx context.Context, on bool) (time.Time, error) {
	var st FailAllState
	q := "?on=0"
	if on {
		q = "?on=1"
	}
	if err := p.stat(ctx, http.MethodPost, pathFailAll+q, &st); err != nil {
		return time.Time{}, err
	}
	if st.FailAll != on {
		return time.Time{}, fmt.Errorf("%s: fail-all %v, asked for %v", p.Name, st.FailAll, on)
	}
	return st.At, nil
}

// SetSlow switches the share of the tier's requests that are slow
// (Work.Slow) to share, in [0, 1].
func (p *Proc) SetSlow(ctx context.Context, share float64) error {
	var st SlowState
	if err := p.stat(ctx, http.MethodPost, pathSlow+"?share="+strconv.FormatFloat(share, 'g', -1, 64), &st); err != nil {
		return err
	}
	if st.Share != share {
		return fmt.Errorf("%s: slow %v, asked for %v", p.Name, st.Share, share)
	}
	return nil
}

// statTimeout bounds a request to a tier's stats port.
const statTimeout = 10 * time.Second

// stat sends a request to path on the tier's stats port and decodes its
// JSON answer into v.
func (p *Proc) stat(ctx context.Context, method, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, statTimeout)
	defer cancel()
	what := strings.TrimPrefix(strings.SplitN(path, "?", 2)[0], "/")
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(p.stats, pathCounts)+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", p.Name, what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", p.Name, what, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s: %s: %w", p.Name, what, err)
	}
	return nil
}

// Kill ends the tier at once (SIGKILL: it runs no more code, its
// connections are cut, calls in flight fail), waits for it, and returns
// when the signal was sent: no request that reaches it after that is
// served. A tier killed is not an error of Stop.
func (p *Proc) Kill() (time.Time, error) {
	var (
		at  time.Time
		ran bool
		err error
	)
	p.once.Do(func() {
		ran = true
		select {
		case <-p.exited:
			p.err = fmt.Errorf("%s exited before the kill (%v): %s", p.Name, p.err, p.tail)
			err = p.err
			return
		default:
		}
		at = time.Now().Round(0)
		if err = p.cmd.Process.Kill(); err != nil {
			err = fmt.Errorf("kill %s: %w", p.Name, err)
			return
		}
		<-p.exited
		p.err = nil
	})
	if !ran {
		return time.Time{}, fmt.Errorf("%s: already stopped", p.Name)
	}
	return at, err
}

// stopTimeout bounds a graceful stop; the tier is killed after it.
const stopTimeout = 10 * time.Second

// Stop ends the tier (SIGTERM, then SIGKILL after stopTimeout) and
// waits for it. It reports an exit that was not the stop's doing.
func (p *Proc) Stop() error {
	p.once.Do(func() {
		select {
		case <-p.exited:
			p.err = fmt.Errorf("%s exited during the run (%v): %s", p.Name, p.err, p.tail)
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			_ = p.cmd.Process.Kill()
			<-p.exited
			p.err = fmt.Errorf("%s: killed, still running %v after SIGTERM", p.Name, stopTimeout)
			return
		}
		if p.err != nil {
			p.err = fmt.Errorf("%s: %v: %s", p.Name, p.err, p.tail)
		}
	})
	return p.err
}

// lineWriter passes the lines written to it to a channel; what a tier
// prints beyond the lines the harness reads is dropped.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	c   chan string
}

func newLineWriter() *lineWriter { return &lineWriter{c: make(chan string, 16)} }

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		select {
		case w.c <- string(w.buf[:i]):
		default:
		}
		w.buf = w.buf[i+1:]
	}
}

// tailWriter keeps the last max bytes written to it, for error messages.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	if over := len(w.buf) - w.max; over > 0 {
		w.buf = w.buf[over:]
	}
	return len(b), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(string(w.buf))
}
