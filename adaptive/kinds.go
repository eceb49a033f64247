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
	// silentN: the kind's silences among the throttle's silentN, not
	// yet counted (see countSilences).
	silentN int64
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

// countSilences adds n silences at el to the window, each to the window
// of its own kind: the silence that made them count (see silences) may
// be of another kind than most of them, which, counted for it, read as
// its failures while the kind that hung read as served. t.mu is held.
func (t *Throttle) countSilences(el, n int64) {
	b := t.bucket(el)
	b.req += n
	for i := range t.kinds {
		k := &t.kinds[i]
		if k.silentN > 0 && k.kind != "" {
			bucketAt(&k.buckets, el, t.width).req += k.silentN
		}
		k.silentN = 0
	}
}

// clearSilences forgets the kinds' silences not yet counted. t.mu is
// held.
func (t *Throttle) clearSilences() {
	for i := range t.kinds {
		t.kinds[i].silentN = 0
	}
}

// count adds an outcome at el to the window, and to kind's: req
// requests, acc of them accepted, busy of them answered busy (counted
// for the kind only). t.mu is held.
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
// requests and accepts in the window, if that is lower. So a kind that
// fails everything (a watch whose backend is down, re-opened at once by
// its callers) sheds the target's other kinds no more than their own
// outcomes say: with one probability for all, a user's trial served
// 16-39 % of a server's healthy unary calls while its watch failed.
//
// It is never higher than p: a target overloaded as a whole is shed as
// before, and so is a kind with fewer than minRequests outcomes in the
// window and, past maxKinds kinds in the window, the others (first come,
// first kept). Shedding a kind that fails everything harder than the
// target was tried: a slow kind, whose accepts come more than a window
// after it asked, read as one from a few random failures and kept itself
// shed. A kind's window is emptied with the target's only where it is
// the only kind (see clearKinds). t.mu is held.
func (t *Throttle) kindProbability(el int64, kind string, p float64) float64 {
	if p == 0 {
		return 0
	}
	k := t.kindFor(kind, el, false)
	if k == nil {
		return p
	}
	w := sumOf(&k.buckets, el, t.width)
	if w.req < minRequests {
		return p // too few of its own to tell
	}
	return min(p, max(0, (float64(w.req)-t.cfg.K*float64(w.acc))/float64(w.req+1)))
}

// kindFailing reports whether kind failed nearly every request of the
// window (minRequests at least, fewer than one in ten accepted, and
// fewer than one in ten answered busy: a busy answer is no failure, see
// Busy): its retries are futile, whatever the target's other kinds do. Beside
// methods the target serves, the target's probability is 0, and a
// method failing everything was retried in full: 3.0 calls per request
// at payment where retries off sent 1.0 (a user's trial). Retries only:
// a first attempt goes out as the target's and its kind's probability
// say, so that a kind whose accepts come a window after it asked (a slow
// method, a stream's first message) is not kept from gathering them;
// until its first answers come (after a cold start, or after a down and
// up, which forgets the answers to attempts allowed before it), such a
// kind's retries and hedges are refused on its early failures.
// For a client of one kind, the target's probability is above 0 then,
// and its retries were refused already. t.mu is held.
func (t *Throttle) kindFailing(el int64, kind string) bool {
	k := t.kindFor(kind, el, false)
	if k == nil {
		return false
	}
	w := sumOf(&k.buckets, el, t.width)
	return w.req >= minRequests && 10*w.acc < w.req && 10*w.busy < w.req
}

// clearKinds empties the kinds' windows with the target's at el when at most
// one kind is in them, so that a client of one kind sheds and retries
// exactly as it would without kinds (kept, its older accepts let its
// retries go into a target just back up and failing again, where the
// target's empty window would not have: a review). Several kinds keep
// theirs: emptied at each of the short downs that a kind failing
// everything causes, a served kind met the failing kind's next burst with
// too few outcomes of its own and was shed as the target was (a user's
// trial: 24-75 % of the unary calls served beside a failing watch,
// against 100 % with the windows kept). t.mu is held.
func (t *Throttle) clearKinds(el int64) {
	idx := el / t.width
	inUse := 0
	for i := range t.kinds {
		if k := &t.kinds[i]; k.kind != "" && !k.staleAt(idx) {
			inUse++
		}
	}
	if inUse > 1 {
		return
	}
	for i := range t.kinds {
		t.kinds[i].buckets = [numBuckets]bucket{}
	}
}
