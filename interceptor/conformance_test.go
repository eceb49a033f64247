package interceptor

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// specPath is the wire protocol specification whose examples
// TestConformance checks.
const specPath = "../docs/protocol.md"

// protocolKeys are the request keys of the specification: an outgoing
// example lists every one of them that is sent.
var protocolKeys = []string{MetadataAttempt, MetadataDepth, MetadataUpstreamRetries, MetadataPreviousAttempts, MetadataEnvoyAttemptCount}

// specExample is one fenced example block of docs/protocol.md.
type specExample struct {
	kind    string   // request, trailer, outgoing or answer
	options []string // words after the kind on the opening line
	line    int      // of the opening fence, for messages
	md      metadata.MD
	fields  map[string]string // "serving", "attempt" (outgoing)
	want    []string          // the lines after "=>", trimmed
}

func (e specExample) String() string { return fmt.Sprintf("%s:%d (%s)", specPath, e.line, e.kind) }

// readSpecExamples extracts the request, trailer and outgoing blocks.
func readSpecExamples(t *testing.T) []specExample {
	t.Helper()
	f, err := os.Open(specPath)
	if err != nil {
		t.Fatalf("the specification must be readable: %v", err)
	}
	defer f.Close()
	var (
		out []specExample
		cur *specExample
		n   int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		if cur == nil {
			words := strings.Fields(strings.TrimPrefix(line, "```"))
			if strings.HasPrefix(line, "```") && len(words) > 0 && slices.Contains([]string{"request", "trailer", "outgoing", "answer"}, words[0]) {
				cur = &specExample{kind: words[0], options: words[1:], line: n, md: metadata.MD{}, fields: map[string]string{}}
			}
			continue
		}
		switch {
		case line == "```":
			if len(cur.want) == 0 {
				t.Fatalf("%v: no \"=>\" line", cur)
			}
			out = append(out, *cur)
			cur = nil
		case strings.HasPrefix(line, "=>"):
			cur.want = append(cur.want, strings.TrimSpace(strings.TrimPrefix(line, "=>")))
		default:
			key, val, ok := strings.Cut(line, ":")
			if !ok {
				t.Fatalf("%s:%d: want \"key: value\", got %q", specPath, n, line)
			}
			val = strings.TrimPrefix(val, " ")
			if cur.kind == "outgoing" {
				cur.fields[key] = strings.TrimSpace(val)
				continue
			}
			cur.md[key] = append(cur.md[key], val)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%v: unterminated block", cur)
	}
	return out
}

// parseSpecInfo reads "depth=D attempt=A upstream-retries=U".
func parseSpecInfo(t *testing.T, e specExample, s string) Info {
	t.Helper()
	var in Info
	fields := map[string]*int{"depth": &in.Depth, "attempt": &in.Attempt, "upstream-retries": &in.UpstreamRetries}
	seen := 0
	for _, w := range strings.Fields(s) {
		k, v, _ := strings.Cut(w, "=")
		p, ok := fields[k]
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			t.Fatalf("%v: bad Info %q", e, s)
		}
		*p = n
		seen++
	}
	if seen != len(fields) {
		t.Fatalf("%v: Info %q must name depth, attempt and upstream-retries", e, s)
	}
	return in
}

// TestConformance checks the implementation against every example of the
// wire protocol specification, docs/protocol.md: the Info a server
// computes from request headers (through the server interceptor's own
// path, with the options the example names), the metadata a client
// attempt sends, how a client reads the pushback trailer, and what a
// tier whose call gave up answers its own caller.
func TestConformance(t *testing.T) {
	examples := readSpecExamples(t)
	count := map[string]int{}
	for _, e := range examples {
		count[e.kind]++
		switch e.kind {
		case "request":
			checkRequestExample(t, e)
		case "trailer":
			checkTrailerExample(t, e)
		case "outgoing":
			checkOutgoingExample(t, e)
		case "answer":
			checkAnswerExample(t, e)
		}
	}
	// A parser that found nothing would pass vacuously.
	for kind, least := range map[string]int{"request": 20, "trailer": 8, "outgoing": 5, "answer": 3} {
		if count[kind] < least {
			t.Errorf("%d %s examples in %s, want at least %d", count[kind], kind, specPath, least)
		}
	}
}

// specOptions maps an example's options to interceptor options.
func specOptions(t *testing.T, e specExample) []Option {
	t.Helper()
	var opts []Option
	for _, o := range e.options {
		switch o {
		case "untrusted":
			opts = append(opts, WithUntrustedCallers())
		case "envoy-off":
			opts = append(opts, WithEnvoyAttemptCount(false))
		default:
			t.Fatalf("%v: unknown option %q", e, o)
		}
	}
	return opts
}

func checkRequestExample(t *testing.T, e specExample) {
	t.Helper()
	if len(e.want) != 1 {
		t.Fatalf("%v: want one \"=>\" line", e)
	}
	want := parseSpecInfo(t, e, e.want[0])
	i, err := New(specOptions(t, e)...)
	if err != nil {
		t.Fatalf("%v: %v", e, err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), e.md)
	got, ok := FromContext(i.server.begin(ctx, "/spec.Service/Method"))
	if !ok || got != want {
		t.Errorf("%v: headers %q: got %+v, want %+v", e, map[string][]string(e.md), got, want)
	}
}

func checkTrailerExample(t *testing.T, e specExample) {
	t.Helper()
	if len(e.want) != 1 {
		t.Fatalf("%v: want one \"=>\" line", e)
	}
	ms, ok := pushback(e.md)
	var got string
	switch {
	case !ok:
		got = "no pushback"
	case ms < 0:
		got = "do not retry"
	default:
		got = fmt.Sprintf("retry after %d ms", ms)
	}
	if got != e.want[0] {
		t.Errorf("%v: trailer %q: got %q, want %q", e, map[string][]string(e.md), got, e.want[0])
	}
}

func checkOutgoingExample(t *testing.T, e specExample) {
	t.Helper()
	ctx := context.Background()
	switch s := e.fields["serving"]; s {
	case "":
		t.Fatalf("%v: no \"serving:\" line", e)
	case "none":
	default:
		ctx = &stateCtx{Context: ctx, st: serverState{info: parseSpecInfo(t, e, s)}}
	}
	attempt, err := strconv.Atoi(e.fields["attempt"])
	if err != nil {
		t.Fatalf("%v: bad \"attempt:\" line: %v", e, err)
	}
	cfg := defaultConfig()
	var c call
	c.init(ctx, &cfg, "spec-target", "/spec.Service/Method")
	c.attempt = attempt
	actx, cancel := c.attemptContext(false)
	defer cancel()
	md, _ := metadata.FromOutgoingContext(actx)
	var got []string
	for _, k := range protocolKeys {
		for _, v := range md.Get(k) {
			got = append(got, k+": "+v)
		}
	}
	var want []string
	for _, w := range e.want {
		if w != "" {
			want = append(want, w)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%v: serving %q, attempt %d: sent %q, want %q", e, e.fields["serving"], attempt, got, want)
	}
}

// checkAnswerExample runs a tier's server and client interceptors, one
// attempt per call: the handler makes one call, whose attempt fails with
// the example's "code" and the rest of its lines as trailer, and returns
// that error; the want lines are the trailer the tier answers with
// (none: "no trailer").
func checkAnswerExample(t *testing.T, e specExample) {
	t.Helper()
	code := codes.Unavailable
	if v := e.md.Get("code"); len(v) == 1 {
		var c codes.Code
		if err := c.UnmarshalJSON([]byte(strconv.Quote(strings.TrimSpace(v[0])))); err != nil {
			t.Fatalf("%v: bad code %q", e, v[0])
		}
		code = c
	}
	trailer := e.md.Copy()
	trailer.Delete("code")
	i, err := New(append(specOptions(t, e), WithMaxAttempts(1))...)
	if err != nil {
		t.Fatalf("%v: %v", e, err)
	}
	invoker := func(_ context.Context, _ string, _, _ any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		for _, o := range opts {
			if tr, ok := o.(*grpc.TrailerCallOption); ok {
				*tr.TrailerAddr = trailer
			}
		}
		return status.Error(code, "from below")
	}
	rec := &trailerStream{}
	ctx := grpc.NewContextWithServerTransportStream(context.Background(), trailerTransport{rec})
	cc := newCC(t)
	_, _ = i.server.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/spec.Service/Method"}, func(ctx context.Context, _ any) (any, error) {
		err := i.client.unary(ctx, "/spec.Service/Next", nil, nil, cc, invoker)
		return nil, status.Convert(err).Err()
	})
	var got []string
	for k, vs := range rec.md {
		for _, v := range vs {
			got = append(got, k+": "+v)
		}
	}
	if len(got) == 0 {
		got = []string{"no trailer"}
	}
	slices.Sort(got)
	want := slices.Clone(e.want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%v: after %v with trailer %q, the tier answered %q, want %q", e, code, map[string][]string(trailer), got, want)
	}
}
