package interceptor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
var protocolKeys = []string{MetadataAttempt, MetadataDepth, MetadataUpstreamRetries, MetadataPreviousAttempts, MetadataEnvoyAttemptCount, MetadataHedging, MetadataTrial, MetadataHeld}

// examplesPath is the spec's examples as data (docs/protocol.md, section
// 10), which TestConformance runs and TestConformanceFile keeps equal to
// the spec.
const examplesPath = "../docs/protocol-examples.json"

// specKinds are the kinds of example blocks; fieldKinds' lines are
// "key: value" fields, the others' metadata.
var (
	specKinds  = []string{"request", "trailer", "outgoing", "answer", "backoff", "deadline", "policy"}
	fieldKinds = []string{"outgoing", "backoff", "deadline", "policy"}
)

// specExample is one fenced example block of docs/protocol.md.
type specExample struct {
	kind    string   // one of specKinds
	options []string // words after the kind on the opening line
	line    int      // of the opening fence, for messages
	md      metadata.MD
	pairs   [][2]string       // md's lines in order, for the examples file
	fields  map[string]string // of fieldKinds: "serving", "attempt", ...
	order   []string          // fields' keys in order
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
			if strings.HasPrefix(line, "```") && len(words) > 0 && slices.Contains(specKinds, words[0]) {
				cur = &specExample{kind: words[0], options: append([]string{}, words[1:]...), line: n, md: metadata.MD{}, fields: map[string]string{}}
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
			if slices.Contains(fieldKinds, cur.kind) {
				cur.fields[key] = strings.TrimSpace(val)
				cur.order = append(cur.order, key)
				continue
			}
			cur.md[key] = append(cur.md[key], val)
			cur.pairs = append(cur.pairs, [2]string{key, val})
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
	var hedging int // optional: 0 none, 1 a tier above hedges, 2 a hedge
	var trial int   // optional: 0 none, 1 a trial
	var held int    // optional: 0 none, 1 held
	fields := map[string]*int{"depth": &in.Depth, "attempt": &in.Attempt, "upstream-retries": &in.UpstreamRetries, "hedging": &hedging, "trial": &trial, "held": &held}
	seen := 0
	for _, w := range strings.Fields(s) {
		k, v, _ := strings.Cut(w, "=")
		p, ok := fields[k]
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			t.Fatalf("%v: bad Info %q", e, s)
		}
		*p = n
		if k != "hedging" && k != "trial" && k != "held" {
			seen++
		}
	}
	if seen != 3 {
		t.Fatalf("%v: Info %q must name depth, attempt and upstream-retries", e, s)
	}
	in.Hedged, in.Hedge = hedging >= hedgingMark, hedging >= hedgeMark
	in.Trial = trial == 1
	in.Held = held == 1
	return in
}

// TestConformance checks the implementation against every example of the
// wire protocol specification, docs/protocol.md: the Info a server
// computes from request headers (through the server interceptor's own
// path, with the options the example names), the metadata a client
// attempt sends, how a client reads the pushback trailer, and what a
// tier whose call gave up answers its own caller.
func TestConformance(t *testing.T) {
	examples := readExamplesFile(t)
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
		case "backoff":
			checkBackoffExample(t, e)
		case "deadline":
			checkDeadlineExample(t, e)
		case "policy":
			checkPolicyExample(t, e)
		}
	}
	// A parser that found nothing would pass vacuously.
	for kind, least := range map[string]int{"request": 20, "trailer": 8, "outgoing": 5, "answer": 3, "backoff": 3, "deadline": 3, "policy": 5} {
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
	// "hedges: yes" is a call that hedges (WithHedging), "hedge" its
	// attempt is a hedge.
	switch h := e.fields["hedges"]; h {
	case "", "no":
	case "yes", "hedge":
		c.hedging, c.hedgeNext = true, h == "hedge"
	default:
		t.Fatalf("%v: bad \"hedges:\" line %q", e, h)
	}
	var want []string
	for _, w := range e.want {
		if w != "" {
			want = append(want, w)
		}
	}
	slices.Sort(want)
	// Both ways of writing the metadata: built per attempt, and shared
	// (a first attempt's, when the call offers it room, see withShared).
	for _, into := range []*mdContext{nil, {}} {
		c.attempt = attempt
		actx, cancel := c.attemptContext(false, into)
		cancel()
		// The shared path is taken exactly where it applies: a first
		// attempt, no upstream retries, some metadata, depth within
		// maxSharedDepth (on a context without metadata of its own).
		shared := into != nil && actx == context.Context(into)
		if want := into != nil && attempt == 0 && c.info.UpstreamRetries == 0 && !c.info.Trial && !c.info.Held && len(want) > 0 && c.info.Depth < maxSharedDepth; shared != want {
			t.Errorf("%v: serving %q, attempt %d: shared metadata %v, want %v", e, e.fields["serving"], attempt, shared, want)
		}
		md, _ := metadata.FromOutgoingContext(actx)
		var got []string
		for _, k := range protocolKeys {
			for _, v := range md.Get(k) {
				got = append(got, k+": "+v)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%v: serving %q, attempt %d, shared room %v: sent %q, want %q", e, e.fields["serving"], attempt, into != nil, got, want)
		}
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
	// committed: the attempt sent headers, and the tier allows three.
	committed := slices.Contains(e.options, "committed")
	e.options = slices.DeleteFunc(slices.Clone(e.options), func(o string) bool { return o == "committed" })
	attempts := 1
	if committed {
		attempts = 3
	}
	i, err := New(append(specOptions(t, e), WithMaxAttempts(attempts), WithBackoff(Backoff{Base: time.Nanosecond}))...)
	if err != nil {
		t.Fatalf("%v: %v", e, err)
	}
	invoker := func(_ context.Context, _ string, _, _ any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		for _, o := range opts {
			if tr, ok := o.(*grpc.TrailerCallOption); ok {
				*tr.TrailerAddr = trailer
			}
			if h, ok := o.(*grpc.HeaderCallOption); ok && committed {
				*h.HeaderAddr = metadata.MD{}
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

// checkBackoffExample: the default backoff's wait before retry n for the
// draw u.
func checkBackoffExample(t *testing.T, e specExample) {
	t.Helper()
	n, err1 := strconv.Atoi(e.fields["retry"])
	u, err2 := strconv.ParseFloat(e.fields["u"], 64)
	if err1 != nil || err2 != nil || len(e.want) != 1 {
		t.Fatalf("%v: want \"retry:\", \"u:\" and one \"=>\" line", e)
	}
	d := Backoff{}.Delay(n, u, 0)
	if got := fmt.Sprintf("%d ms", d/time.Millisecond); got != e.want[0] {
		t.Errorf("%v: retry %d, u %v: waits %v (%q), want %q", e, n, u, d, got, e.want[0])
	}
}

// checkDeadlineExample: whether a retry that waits "wait" ms may start
// with "remaining" ms left.
func checkDeadlineExample(t *testing.T, e specExample) {
	t.Helper()
	rem, err1 := strconv.Atoi(e.fields["remaining"])
	wait, err2 := strconv.Atoi(e.fields["wait"])
	if err1 != nil || err2 != nil || len(e.want) != 1 {
		t.Fatalf("%v: want \"remaining:\", \"wait:\" and one \"=>\" line", e)
	}
	got := "do not retry"
	if roomForRetry(time.Duration(rem)*time.Millisecond, time.Duration(wait)*time.Millisecond) {
		got = "retry"
	}
	if got != e.want[0] {
		t.Errorf("%v: %d ms left, wait %d ms: %q, want %q", e, rem, wait, got, e.want[0])
	}
}

// checkPolicyExample: the attempts a call may make under a
// TierPolicyConfig (none: the default policy), as call.init computes them.
func checkPolicyExample(t *testing.T, e specExample) {
	t.Helper()
	ints := func(key string) []int {
		var out []int
		for _, w := range strings.Fields(e.fields[key]) {
			n, err := strconv.Atoi(w)
			if err != nil {
				t.Fatalf("%v: %s: %v", e, key, err)
			}
			out = append(out, n)
		}
		return out
	}
	one := func(key string, def int) int {
		if v := ints(key); len(v) == 1 {
			return v[0]
		}
		return def
	}
	configured := one("configured", DefaultMaxAttempts)
	policy := DefaultTierPolicy
	if e.fields["attemptsByDepth"] != "" || e.fields["deeperAttempts"] != "" || e.fields["upstreamRetriedAttempts"] != "" {
		p, err := TierPolicyConfig{AttemptsByDepth: ints("attemptsByDepth"), DeeperAttempts: one("deeperAttempts", 0), UpstreamRetriedAttempts: one("upstreamRetriedAttempts", 0)}.Policy()
		if err != nil {
			t.Fatalf("%v: %v", e, err)
		}
		policy = p
	}
	cfg := defaultConfig()
	cfg.maxAttempts, cfg.policy = configured, policy
	ctx := &stateCtx{Context: context.Background(), st: serverState{info: parseSpecInfo(t, e, e.fields["serving"])}}
	var c call
	c.init(ctx, &cfg, "spec-target", "/spec.Service/Method")
	if got := fmt.Sprintf("attempts: %d", c.max); len(e.want) != 1 || got != e.want[0] {
		t.Errorf("%v: %q, want %q", e, got, e.want)
	}
}

// exampleJSON is one example of docs/protocol-examples.json.
type exampleJSON struct {
	Kind     string      `json:"kind"`
	Options  []string    `json:"options"`
	Line     int         `json:"line"`
	Metadata [][2]string `json:"metadata,omitempty"`
	Fields   [][2]string `json:"fields,omitempty"`
	Want     []string    `json:"want"`
}

// examplesFile is docs/protocol-examples.json.
type examplesFile struct {
	Protocol string        `json:"protocol"`
	Source   string        `json:"source"`
	Note     string        `json:"note"`
	Examples []exampleJSON `json:"examples"`
}

// specVersion returns the version in the specification's title, "# The
// stormguard wire protocol, version X".
func specVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	title, _, _ := strings.Cut(string(b), "\n")
	_, v, ok := strings.Cut(title, ", version ")
	if !ok || v == "" {
		t.Fatalf("%s: title %q does not name the version", specPath, title)
	}
	return v
}

// examplesJSON renders the spec's examples as the examples file.
func examplesJSON(t *testing.T, examples []specExample) []byte {
	t.Helper()
	f := examplesFile{
		Protocol: specVersion(t),
		Source:   "docs/protocol.md",
		Note:     "Generated from docs/protocol.md (section 10 describes the fields); do not edit: STORMGUARD_UPDATE_EXAMPLES=1 go test -run TestConformanceFile ./interceptor/",
	}
	for _, e := range examples {
		x := exampleJSON{Kind: e.kind, Options: e.options, Line: e.line, Metadata: e.pairs, Want: e.want}
		for _, k := range e.order {
			x.Fields = append(x.Fields, [2]string{k, e.fields[k]})
		}
		f.Examples = append(f.Examples, x)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// readExamplesFile reads docs/protocol-examples.json back into examples.
func readExamplesFile(t *testing.T) []specExample {
	t.Helper()
	b, err := os.ReadFile(examplesPath)
	if err != nil {
		t.Fatalf("the examples file must be readable: %v", err)
	}
	var f examplesFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", examplesPath, err)
	}
	var out []specExample
	for _, x := range f.Examples {
		e := specExample{kind: x.Kind, options: x.Options, line: x.Line, md: metadata.MD{}, pairs: x.Metadata, fields: map[string]string{}, want: x.Want}
		for _, p := range x.Metadata {
			e.md[p[0]] = append(e.md[p[0]], p[1])
		}
		for _, p := range x.Fields {
			e.fields[p[0]] = p[1]
			e.order = append(e.order, p[0])
		}
		out = append(out, e)
	}
	return out
}

// The examples file is the spec's examples, exactly: another
// implementation that runs it runs what TestConformance runs.
func TestConformanceFile(t *testing.T) {
	want := examplesJSON(t, readSpecExamples(t))
	if os.Getenv("STORMGUARD_UPDATE_EXAMPLES") == "1" {
		if err := os.WriteFile(examplesPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(examplesPath)
	if err != nil {
		t.Fatalf("the examples file must be readable: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the examples of %s: run STORMGUARD_UPDATE_EXAMPLES=1 go test -run TestConformanceFile ./interceptor/", examplesPath, specPath)
	}
}
