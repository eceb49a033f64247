//go:build interop

package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	testsvcv1 "github.com/stormguard/stormguard/proto/stormguard/testsvc/v1"
)

// The interop check (make interop; not part of make test, which needs
// nothing but Go): an order tier in Python, written from docs/protocol.md
// alone (testdata/interop/order.py, on grpcio), between a Go gateway and a
// Go payment, each its own process over loopback TCP.

// python is the interpreter with grpcio: Debian's python3-grpcio installs
// for /usr/bin/python3; STORMGUARD_PYTHON names another.
func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("STORMGUARD_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import grpc").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc (make interop installs python3-grpcio): %v\n%s", py, err, out)
	}
	return py
}

// startTierMode starts one Go tier in mode and waits for its address.
func startTierMode(t *testing.T, bin, mode, tier, next string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"serve", "--tier", tier, "--listen", "127.0.0.1:0", "--mode", mode}, extra...)
	if next != "" {
		args = append(args, "--next", next)
	}
	p := startProc(t, tier, bin, args...)
	p.addr = p.expect(t, 20*time.Second, "listen address", func(string) bool { return true })
	return p
}

// TestInteropPythonTier: with payment failing every call, one request
// costs 1 / 1 / 3 calls at gateway / order / payment, as with a Go order
// tier (the Python tier retries next to the failure and answers "do not
// retry"; the Go gateway honours it); and a request the edge marks as a
// retry gets one attempt at every tier, the Python one included (it reads
// x-upstream-retries from the gateway).
func TestInteropPythonTier(t *testing.T) {
	py := python(t)
	bin := buildBinary(t)
	for _, mode := range []string{"tiered", "recommended"} {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t, 2*time.Minute)
			pay := startTierMode(t, bin, mode, "payment", "", "--flaky", "1")
			order := startProc(t, "order.py", py, "testdata/interop/order.py", "--next", pay.addr)
			order.addr = order.expect(t, 20*time.Second, "listen address", func(string) bool { return true })
			gw := startTierMode(t, bin, mode, "gateway", order.addr)

			conn, err := grpc.NewClient("passthrough:///"+gw.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cl := testsvcv1.NewTestServiceClient(conn)
			const n = 20
			send := func(md metadata.MD) {
				t.Helper()
				for i := range n {
					rctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), 10*time.Second)
					var trailer metadata.MD
					_, err := cl.Unary(rctx, &testsvcv1.UnaryRequest{Id: strconv.Itoa(i)}, grpc.Trailer(&trailer))
					cancel()
					if status.Code(err) != codes.Unavailable {
						t.Fatalf("request %d: %v, want Unavailable from the failing payment", i, err)
					}
					if got := trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "-1" {
						t.Fatalf("request %d: the gateway answered pushback %q, want [-1]: it gave up", i, got)
					}
				}
			}
			counts := func() (gateway, atOrder, atPayment int64) {
				gateway, atOrder = tierCounts(t, ctx, gw.addr)
				atPayment, _ = tierCounts(t, ctx, pay.addr)
				return gateway, atOrder, atPayment
			}

			send(nil)
			g, o, p := counts()
			if g != n || o != n || p != 3*n {
				t.Fatalf("%d requests, payment failing: %d / %d / %d calls at gateway / order / payment, want %d / %d / %d", n, g, o, p, n, n, 3*n)
			}
			served := order.expect(t, 10*time.Second, "its counts", func(l string) bool { return l == "served "+strconv.Itoa(n)+" attempts "+strconv.Itoa(3*n) })
			t.Logf("%s: %d requests: %d / %d / %d calls; order.py: %s", mode, n, g, o, p, served)

			send(metadata.Pairs("x-retry-attempt", "1"))
			g2, o2, p2 := counts()
			if g2-g != n || o2-o != n || p2-p != n {
				t.Fatalf("%d requests marked as an edge retry: %d / %d / %d calls, want %d at every tier", n, g2-g, o2-o, p2-p, n)
			}
			if !strings.HasPrefix(order.addr, "127.0.0.1:") {
				t.Fatalf("order.py listens on %q, want loopback", order.addr)
			}
		})
	}
}
