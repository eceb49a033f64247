package admission

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

// longRuns is how many times the mean failure run (of those that ended
// with something served) a run must hold to count: runs of random
// failures are about geometric, so one of 16 times the mean comes about
// once in e^16 (9e6) runs. The need is counted in failures, not time, so
// that it means the same at every request rate, and is capped at
// maxRunFactor x MinFailures, so that no history can hide a real outage
// for long.
const (
	longRuns     = 16
	maxRunFactor = 4
	// maxMinFailures bounds ServingConfig.MinFailures (so that
	// maxRunFactor times it cannot overflow): a million failures in a
	// row is "practically never" at any rate.
	maxMinFailures = 1 << 20
)

// Defaults for the zero fields of [ServingConfig].
const (
	DefaultMinFailures   = 20
	DefaultQuiet         = 50 * time.Millisecond
	DefaultTrial         = 200 * time.Millisecond
	DefaultTrialFailures = 2
)

// ServingConfig configures a [Serving]. The zero value is a usable
// configuration with the defaults listed on each field.
type ServingConfig struct {
	// MinFailures is the number of the server's own failures in a row,
	// with nothing served between them, that make it not serving once
	// they have lasted Quiet. Zero means DefaultMinFailures (20): at
	// 30 % random failures a run of 20 starts with a probability of
	// 0.3^20, about 3.5e-11, so random failures never trip it, while a
	// server that fails everything at 1 000 requests/s has 20 in 20 ms.
	// Valid: 1 to 1 048 576.
	MinFailures int

	// Quiet is how long the run must last with nothing served. Zero means DefaultQuiet
	// (50 ms): a server at a fifth of its capacity and 1 000 requests/s
	// serves something every few milliseconds.
	Quiet time.Duration

	// Trial is how long the server stays not serving before it serves
	// again on trial, to find out whether it can: clients that watch its
	// health send it nothing while it is not serving, so it can learn
	// that it is back only by trying. Zero means DefaultTrial (200 ms),
	// which bounds the time every client needs to see the server back
	// after an outage of any length, at a cost of a few calls per trial
	// (TrialFailures, plus those in flight while the clients learn of
	// the new state), whatever the number of clients.
	Trial time.Duration

	// TrialFailures decides a trial: it ends when the server has failed
	// TrialFailures more of the trial's requests than it served, and
	// passes (the server serves as usual again) when it has served as
	// many more than it failed. Zero means DefaultTrialFailures (2): a
	// server that is back passes on its first two answers, one that fails
	// 95 % of its requests fails 99.7 % of its trials.
	TrialFailures int

	// Clock is the time source. Nil means the system clock.
	Clock Clock
}

func (c ServingConfig) normalize() (ServingConfig, error) {
	bad := func(format string, args ...any) (ServingConfig, error) {
		return ServingConfig{}, invalidf(format, args...)
	}
	orDefault(&c.MinFailures, DefaultMinFailures)
	orDefault(&c.Quiet, DefaultQuiet)
	orDefault(&c.Trial, DefaultTrial)
	orDefault(&c.TrialFailures, DefaultTrialFailures)
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	switch {
	case c.MinFailures < 1 || c.MinFailures > maxMinFailures:
		return bad("ServingConfig.MinFailures %d: want 1 to %d", c.MinFailures, maxMinFailures)
	case c.Quiet < 0 || c.Quiet > time.Hour:
		return bad("ServingConfig.Quiet %v: want up to 1h (0: the default, %v)", c.Quiet, DefaultQuiet)
	case c.Trial < time.Millisecond || c.Trial > time.Hour:
		return bad("ServingConfig.Trial %v: want 1ms to 1h", c.Trial)
	case c.TrialFailures < 1 || c.TrialFailures > c.MinFailures:
		return bad("ServingConfig.TrialFailures %d: want 1 to MinFailures (%d)", c.TrialFailures, c.MinFailures)
	}
	return c, nil
}

// Serving tracks whether a server can serve at all, from its own answers,
// so that it can say so to its clients through gRPC health checking (see
// interceptor.WithHealth). Create one with NewServing. It is safe for
// concurrent use.
//
// The server's handlers report each answer with Record (or RecordFrom,
// with the Epoch read when the request started): served (any
// answer that is not a failure of the server itself) or failed (the
// handler's own transient failure, such as UNAVAILABLE because its
// database is down). Failures passed up from a server further down the
// chain, and requests refused by admission control, are neither: the
// first say nothing of this server, the second come from a server that is
// alive and overloaded. A run of MinFailures own failures, with nothing
// served for Quiet, makes the server not serving; at a partial loss, where
// failure runs end with something served, the run must also hold 16 times
// as many failures as the recent runs that ended so, on average (at most
// 4 x MinFailures), so that a server that serves one request in five is
// not taken for dead at any rate (it is when it then serves nothing for
// 64 requests). Its clients, which see its
// health, stop sending it requests; after Trial it serves again on trial,
// which TrialFailures more failures than served answers, of requests that
// started during the trial, end, and as many more served answers pass.
// Only a trial makes it serving again: so a server that fails nearly
// everything stays not serving, with a short trial every Trial, rather
// than flapping with every answer it happens to serve.
//
// Why the server decides, and not each client: a server sees the requests
// of all its clients. A fleet of a thousand quiet clients each sees one
// failure now and then, which it cannot tell from a random one, and each
// must make a call to learn anything; the server sees a thousand failures
// a second, knows within milliseconds, and its health reaches every
// client's channel at no cost per request.
type Serving struct {
	cfg   ServingConfig
	start time.Time

	// fast is 1 while the server is serving with no run of failures: a
	// served answer then changes nothing.
	fast atomic.Bool
	// epoch counts the trials started; a request reads it when it
	// starts (Epoch).
	epoch atomic.Uint64

	mu       sync.Mutex
	serving  bool
	trial    bool
	run      int
	runStart time.Duration
	downAt   time.Duration
	downs    int64
	balance  int // during a trial: served minus failed answers
	// meanRun is the mean number of failures (a moving average, weight
	// 1/16) of the runs of failures that ended with something served.
	meanRun float64
}

// NewServing returns a tracker for a server that is serving, or an error
// wrapping ErrInvalidConfig.
func NewServing(cfg ServingConfig) (*Serving, error) {
	c, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	s := &Serving{cfg: c, start: c.Clock.Now(), serving: true}
	s.fast.Store(true)
	return s, nil
}

func (s *Serving) elapsed() time.Duration { return max(s.cfg.Clock.Now().Sub(s.start), 0) }

// Epoch returns the number of trials started, for RecordFrom: read it
// when a request starts.
func (s *Serving) Epoch() uint64 { return s.epoch.Load() }

// Record reports one of the server's answers: served true for an answer
// served, false for the server's own failure. It reports whether the
// server's state changed (see Serving.Serving).
func (s *Serving) Record(served bool) (changed bool) {
	return s.RecordFrom(s.Epoch(), served)
}

// RecordFrom is Record for a request that started at epoch (Epoch): the
// failure of a request that started before the current trial does not
// count against the trial (a handler that waited on a dead database since
// before it may fail after the database is back).
func (s *Serving) RecordFrom(epoch uint64, served bool) (changed bool) {
	if served && s.fast.Load() {
		return false
	}
	now := s.elapsed()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.serving:
		// Only a trial makes a server that is not serving serve again:
		// the answers of clients that do not watch its health, served or
		// not, say nothing of whether it serves enough to be called
		// (a server that fails 95 % of its requests used to flip to
		// serving on each of the other 5 %).
		return false
	case s.trial:
		return s.trialAnswer(epoch, served)
	case served:
		if s.run > 0 {
			s.meanRun += (float64(s.run) - s.meanRun) / 16
		}
		s.run = 0
		s.fast.Store(true)
		return false
	}
	s.fast.Store(false)
	if s.run == 0 {
		s.runStart = now
	}
	s.run++
	need := min(max(s.cfg.MinFailures, int(longRuns*s.meanRun)), maxRunFactor*s.cfg.MinFailures)
	if s.run < need || now-s.runStart < s.cfg.Quiet {
		return false
	}
	s.down(now)
	return true
}

// down makes the server not serving at now. The runs of failures seen
// before are forgotten: after an outage the server is judged afresh, so
// that one that passes a trial and then fails as before is not serving
// again after MinFailures, not after the long runs of its history. s.mu
// is held.
func (s *Serving) down(now time.Duration) {
	s.serving, s.trial, s.run, s.balance, s.meanRun = false, false, 0, 0, 0
	s.downAt = now
	s.downs++
}

// trialAnswer counts an answer during a trial: TrialFailures more served
// than failed answers pass it (the full rule applies again), as many more
// failed ones end it. A failure of a request that started before the
// trial says nothing of it (a handler that waited on a dead database
// since before it may fail after the database is back). s.mu is held.
func (s *Serving) trialAnswer(epoch uint64, served bool) (changed bool) {
	if served {
		if s.balance++; s.balance >= s.cfg.TrialFailures {
			s.trial, s.run, s.balance = false, 0, 0
			s.fast.Store(true)
		}
		return false
	}
	if epoch < s.epoch.Load() {
		return false
	}
	if s.balance--; s.balance > -s.cfg.TrialFailures {
		return false
	}
	s.down(s.elapsed())
	return true
}

// Serving reports whether the server can serve, as far as its own answers
// tell.
func (s *Serving) Serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serving
}

// TrialIn returns how long until the server, not serving, may serve again
// on trial (call Trial then); 0 when it is serving or the trial is due.
func (s *Serving) TrialIn() time.Duration {
	now := s.elapsed()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving {
		return 0
	}
	return max(s.downAt+s.cfg.Trial-now, 0)
}

// Trial starts a trial if the server has not been serving for Trial: it is
// serving again, until TrialFailures more of the trial's requests failed
// than were served (or as many more were served: the trial passed). It
// reports whether it started one.
func (s *Serving) Trial() bool {
	now := s.elapsed()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving || now-s.downAt < s.cfg.Trial {
		return false
	}
	s.serving, s.trial, s.run, s.balance = true, true, 0, 0
	s.epoch.Add(1)
	return true
}

// Downs returns how many times the server became not serving.
func (s *Serving) Downs() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downs
}
