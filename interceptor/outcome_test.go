package interceptor

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/adaptive"
	"github.com/stormguard/stormguard/breaker"
)

// outcomeRow is one row of the outcome table of docs/protocol.md (4.3).
type outcomeRow struct {
	line                             int
	end                              string
	outcome, brk, budget, thr, retry string
	brkProbe, thrProbe               string // after "/ probe:", if given
	parsed                           ending
}

// readOutcomeTable reads the rows between the outcome-table markers.
func readOutcomeTable(t *testing.T) []outcomeRow {
	t.Helper()
	b, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatalf("the specification must be readable: %v", err)
	}
	var rows []outcomeRow
	in := false
	for n, line := range strings.Split(string(b), "\n") {
		switch {
		case line == "<!-- outcome-table -->":
			in = true
			continue
		case line == "<!-- /outcome-table -->":
			in = false
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 6 {
			t.Fatalf("%s:%d: want 6 cells, got %d", specPath, n+1, len(cells))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		r := outcomeRow{line: n + 1, end: strings.Trim(cells[0], "`"), outcome: cells[1], budget: cells[3], retry: cells[5]}
		r.brk, r.brkProbe, _ = strings.Cut(cells[2], " / probe: ")
		r.thr, r.thrProbe, _ = strings.Cut(cells[4], " / probe: ")
		r.parsed = parseEnding(t, r)
		rows = append(rows, r)
	}
	if len(rows) < 10 {
		t.Fatalf("%s: found %d rows of the outcome table, want the whole table", specPath, len(rows))
	}
	return rows
}

// parseEnding reads the first cell of a row: a code name, then the words
// of section 4.3.
func parseEnding(t *testing.T, r outcomeRow) ending {
	t.Helper()
	words := strings.Fields(r.end)
	var e ending
	if err := e.code.UnmarshalJSON([]byte(strconv.Quote(words[0]))); err != nil {
		t.Fatalf("%s:%d: code %q: %v", specPath, r.line, words[0], err)
	}
	for _, w := range words[1:] {
		switch {
		case w == "shed":
			e.shed = true
		case strings.HasPrefix(w, "pushback="):
			pb, err := strconv.ParseInt(strings.TrimPrefix(w, "pushback="), 10, 64)
			if err != nil {
				t.Fatalf("%s:%d: %q: %v", specPath, r.line, w, err)
			}
			e.pushback, e.hasPushback = pb, true
		case w == "cancelled":
			e.callerDone = true
		case w == "expired":
			e.callerDone, e.callerExpired = true, true
		case w == "answered":
			e.answered = true
		case w == "stream":
			e.stream = true
		case w == "own-timeout":
			e.ownTimeout = true
		case w == "past-deadline":
			e.pastDeadline = true
		case w == "retried":
			e.retried = true
		default:
			t.Fatalf("%s:%d: unknown word %q", specPath, r.line, w)
		}
	}
	return e
}

var (
	breakerWords  = map[breaker.Outcome]string{breaker.Success: "success", breaker.Failure: "failure", breaker.Ignored: "ignored"}
	throttleWords = map[adaptive.Outcome]string{adaptive.Accept: "accept", adaptive.Overload: "overload", adaptive.Busy: "busy", adaptive.Ignored: "—", adaptive.Silence: "silence"}
)

// What each mechanism hears, and whether the call may retry, follows the
// table of docs/protocol.md row by row.
func TestOutcomeTable(t *testing.T) {
	for _, r := range readOutcomeTable(t) {
		o := classify(r.parsed)
		at := specPath + ":" + strconv.Itoa(r.line) + " " + r.end
		if got := o.kind.String(); got != r.outcome {
			t.Errorf("%s: outcome %s, want %s", at, got, r.outcome)
			continue
		}
		if got := breakerWords[o.kind.forBreaker(false)]; got != r.brk {
			t.Errorf("%s: breaker hears %s, want %s", at, got, r.brk)
		}
		wantProbe := r.brk
		if r.brkProbe != "" {
			wantProbe = r.brkProbe
		}
		if got := breakerWords[o.kind.forBreaker(true)]; got != wantProbe {
			t.Errorf("%s: a half-open probe's breaker hears %s, want %s", at, got, wantProbe)
		}
		budget := "—"
		if success, ok := o.forLimiter(); ok {
			budget = map[bool]string{false: "failure", true: "success"}[success]
		}
		if budget != r.budget {
			t.Errorf("%s: budget hears %s, want %s", at, budget, r.budget)
		}
		if got := throttleWords[o.kind.forThrottle()]; got != r.thr {
			t.Errorf("%s: throttle hears %s, want %s", at, got, r.thr)
		}
		// The throttle guard revives a down target on exactly the
		// outcome whose row says so.
		if revives := o.kind.revives(); revives != (r.thrProbe == "revive") {
			t.Errorf("%s: a probe revives: %v, table says %q", at, revives, r.thrProbe)
		}
		retry := "no"
		if o.kind != outcomeNothing && !r.parsed.callerDone && o.mayRetry() && !o.saysDontRetry() {
			retry = "yes"
		}
		if retry != r.retry {
			t.Errorf("%s: retry %s, want %s", at, retry, r.retry)
		}
	}
}

// Every outcome kind appears in the table, so that none is decided
// outside it.
func TestOutcomeTableCoversEveryKind(t *testing.T) {
	seen := map[outcomeKind]bool{}
	for _, r := range readOutcomeTable(t) {
		seen[classify(r.parsed).kind] = true
	}
	for k := range outcomeNames {
		if !seen[outcomeKind(k)] {
			t.Errorf("outcome %s has no row in %s", outcomeKind(k), specPath)
		}
	}
	if c := classify(ending{code: codes.OK, shed: true, hasPushback: true, pushback: -1}); c.kind != outcomeSuccess {
		t.Errorf("a success with a pushback and a shed mark: %s, want success", c.kind)
	}
}
