package adaptive

// maxKinds is how many kinds of request (see AllowFor) a throttle keeps
// a window of their own for: the methods of a target that are called
// now, as a rule a handful. A kind past them, or one not seen in the
// window, is shed as the target is.
const maxKinds = 8

// kindWindow is the requests and accepts of one kind of request in the
// window, in buckets as the throttle's own.
type kindWindow struct {
	kind    string
	buckets [numBuckets]bucket
}

// kindFor returns the window of kind, or, with add, a free or stale one
// made its own (nil if kind is "" or every window holds a kind seen in
// the window). t.mu is held.
func (t *Throttle) kindFor(kind string, el int64, add bool) *kindWindow {
	if kind == "" {
		return nil
	}
	for i := range t.kinds {
		if t.kinds[i].kind == kind {
			return &t.kinds[i]
		}
	}
	if !add {
		return nil
	}
	idx := el / t.width
	for i := range t.kinds {
		if k := &t.kinds[i]; k.kind == "" || k.staleAt(idx) {
			*k = kindWindow{kind: kind}
			return k
		}
	}
	return nil
}

// staleAt reports whether no bucket of k lies in the window ending at
// bucket idx.
func (k *kindWindow) staleAt(idx int64) bool {
	for _, b := range k.buckets {
		if b.idx > idx-numBuckets && (b.req > 0 || b.acc > 0) {
			return false
		}
	}
	return true
}

// count adds an outcome at el to the window, and to kind's: req
// requests, acc of them accepted, busy of them answered busy. The accept
// of an attempt allowed longer than a window ago (a stream's first
// message, long after it opened) counts for the target only: a watch's
// streams opened before its backend failed still bring their first
// messages while every new open fails, and counted for the kind they
// hid that its requests are futile. t.mu is held.
func (t *Throttle) count(el int64, kind string, req, acc, busy int64) {
	b := t.bucket(el)
	b.req += req
	b.acc += acc
	if k := t.kindFor(kind, el, true); k != nil {
		b := bucketAt(&k.buckets, el, t.width)
		b.req += req
		b.acc += acc
		b.busy += busy
	}
}

// kindProbability returns the shedding probability of a request of kind
// while the target's is p: the kind's own, by the same rule over its own
// requests and accepts, if that is lower; and the kind's own whatever p
// is for a kind that failed nearly every request of the window (see
// failsAll), whose requests are futile. So a kind that fails
// everything (a watch whose backend is down, re-opened at once by its
// callers) sheds the target's other kinds no more than their own
// outcomes say, and is shed itself on its own evidence: with one
// probability for all, a user's trial served 16-39 % of a server's
// healthy unary calls while its watch failed, and let 900-3 500 watch
// opens a second through. A target overloaded as a whole, whose kinds
// all get some accepts, is shed as before. A kind with no outcome in the
// window yet goes out, to gather one, while there is room for its
// window; past maxKinds kinds, the others are shed as the target is.
// t.mu is held.
func (t *Throttle) kindProbability(el int64, kind string, p float64) float64 {
	if kind == "" {
		return p
	}
	k := t.kindFor(kind, el, false)
	if k == nil {
		if p == 0 || t.kindFor(kind, el, true) != nil {
			return 0 // a window made for it: its outcome fills it
		}
		return p
	}
	w := sumOf(&k.buckets, el, t.width)
	if failsAll(w) {
		return (float64(w.req) - t.cfg.K*float64(w.acc)) / float64(w.req+1)
	}
	if p == 0 || w.req == 0 {
		return 0
	}
	return min(p, max(0, (float64(w.req)-t.cfg.K*float64(w.acc))/float64(w.req+1)))
}

// failsAll reports whether a kind's window shows a kind that fails
// (nearly) everything (see kindProbability): minRequests requests at
// least, fewer than one in ten of them accepted (a watch's streams
// opened before its backend failed still bring their first messages,
// which accept the kind: counting only a kind with no accept at all, a
// user's trial let 1 700-2 500 failing opens a second through), and
// fewer than one in ten answered busy (a busy target is slowed down for
// as a whole, by its probability, never shed harder for one kind).
func failsAll(w bucket) bool {
	return w.req >= minRequests && 10*w.acc < w.req && 10*w.busy < w.req
}

// kindFailsAll reports whether a kind failed every request of the
// window: Allow must look (see publish). t.mu is held.
func (t *Throttle) kindFailsAll(el int64) bool {
	for i := range t.kinds {
		if k := &t.kinds[i]; k.kind != "" && failsAll(sumOf(&k.buckets, el, t.width)) {
			return true
		}
	}
	return false
}

// clearKinds empties the kinds' windows with the throttle's. t.mu is
// held.
func (t *Throttle) clearKinds() {
	for i := range t.kinds {
		t.kinds[i].buckets = [numBuckets]bucket{}
	}
}
