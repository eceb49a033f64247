package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/testsvc"
	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// TestModeList: the demo's six modes, in order, recommended last; the old
// name of recommended says what it became.
func TestModeList(t *testing.T) {
	want := []string{"naive", "one-retry", "budget", "tiered", "stormguard", "recommended"}
	if got := modeNames(); !slices.Equal(got, want) {
		t.Fatalf("modes: got %v, want %v", got, want)
	}
	_, err := findMode("adaptive")
	if err == nil || !strings.Contains(err.Error(), `"recommended"`) {
		t.Fatalf(`findMode("adaptive"): got %v, want an error that names "recommended"`, err)
	}
}

// TestRecommendedOneInstancePerProcess: recommended puts one
// interceptor.New(interceptor.Recommended()...) on each process of the
// chain and takes both sides from it. While one request is held inside
// payment's handler, the admission limiter of every tier's instance
// counts it in flight (the server side carries WithAdmission); once it is
// answered, the edge's, gateway's and order's instances each hold a
// throttle and a budget for the one target their connection calls (the
// client side is the same instance), and payment's, which calls nothing,
// none.
func TestRecommendedOneInstancePerProcess(t *testing.T) {
	m, err := findMode(recommendedMode)
	if err != nil {
		t.Fatal(err)
	}
	stacks, err := buildStacks(func(int) (stack, error) { return m.process(nil) })
	if err != nil {
		t.Fatal(err)
	}
	last := len(stacks) - 1
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	// Inside payment's stormguard interceptor, before its handler.
	stacks[last].server = append(slices.Clip(stacks[last].server), grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return h(ctx, req)
		}))
	chain, err := startStacks(1, stacks)
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Close()

	ctx := ctxT(t, 30*time.Second)
	done := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := chain.Client().Unary(rctx, &testsvcv1.UnaryRequest{Id: "held"})
		done <- err
	}()
	select {
	case <-arrived:
	case err := <-done:
		t.Fatalf("the request ended before it reached payment's handler: %v", err)
	}
	names := append([]string{"edge"}, testsvc.DefaultTiers...)
	for i, st := range stacks {
		if st.ic == nil {
			t.Fatalf("%s: no stormguard instance", names[i])
		}
		l := st.ic.Admission()
		switch {
		case i == 0:
			// The edge client's server side is never installed.
		case l == nil:
			t.Errorf("%s: no admission control on its server side", names[i])
		case l.InFlight() != 1:
			t.Errorf("%s: %d requests in flight at its admission limiter, want the one held at payment", names[i], l.InFlight())
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the held request, released: %v", err)
	}
	for i, st := range stacks {
		throttles, budgets := 0, 0
		st.ic.RangeThrottles(func(string, *adaptive.Throttle) bool { throttles++; return true })
		st.ic.RangeLimiters(func(string, budget.Limiter) bool { budgets++; return true })
		want := 1
		if i == last {
			want = 0
		}
		if throttles != want || budgets != want {
			t.Errorf("%s: %d throttles and %d budgets, want %d of each", names[i], throttles, budgets, want)
		}
	}
}

// TestDefaultModeRecommended: serve and load run recommended unless told
// otherwise; each says so on stderr.
func TestDefaultModeRecommended(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxT(t, 30*time.Second))
	defer cancel()
	stdout := newLineWriter()
	var stderr syncBuffer
	served := make(chan error, 1)
	go func() {
		served <- run(ctx, []string{"serve", "--tier", "payment", "--listen", "127.0.0.1:0"}, stdout, &stderr)
	}()
	var addr string
	select {
	case addr = <-stdout.lines:
	case err := <-served:
		t.Fatalf("serve ended before it listened: %v (stderr %q)", err, stderr.String())
	}
	var out, lerr bytes.Buffer
	if err := run(ctx, []string{"load", "--target", addr, "--users", "1", "--duration", "50ms", "--interval", "10ms"}, &out, &lerr); err != nil {
		t.Fatalf("load: %v (stderr %q)", err, lerr.String())
	}
	if want := "(recommended)"; !strings.Contains(lerr.String(), want) {
		t.Errorf("load's stderr %q lacks %q", lerr.String(), want)
	}
	if !strings.Contains(out.String(), "total requests=") {
		t.Errorf("load printed no summary:\n%s", out.String())
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	// Written after the address, so read once serve has returned.
	if want := "payment (recommended) listening on " + addr; !strings.Contains(stderr.String(), want) {
		t.Errorf("serve's stderr %q lacks %q", stderr.String(), want)
	}
}

// lineWriter sends each complete line written to it on lines (and drops
// lines nobody reads, beyond its buffer).
type lineWriter struct {
	lines chan string
	buf   []byte
}

func newLineWriter() *lineWriter { return &lineWriter{lines: make(chan string, 16)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- string(w.buf[:i]):
		default:
		}
		w.buf = w.buf[i+1:]
	}
}
