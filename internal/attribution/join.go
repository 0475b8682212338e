package attribution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/notify"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// DefaultGrace is how long a change waits for the audit fact that names its author. The
// apiserver's audit webhook sends batches at most --audit-webhook-batch-max-wait apart (30s by
// default upstream; kubescribe's documented setting is 1s), so the fact usually arrives within a
// second or two after the watch event.
const DefaultGrace = 5 * time.Second

// DefaultResumeGrace is how long a change waits for a fact the kube-apiserver may still be
// retrying: a change made while nothing watched (found by a resumed stream), or a live change
// whose audit batch may have failed. The apiserver's audit webhook, with its defaults
// (k8s.io/apiserver v0.37), delivers an event's batch at the latest
//
//	30s     --audit-webhook-batch-max-wait: the event waits in the buffer until its batch is cut
//	2.5s    the batch throttle (10 batches/s): a full buffer of 10,000 events is 25 batches
//	97.5s   the 4 waits between its 5 attempts (--audit-webhook-initial-backoff 10s, x1.5 each
//	        time, up to 20% jitter): (10 + 15 + 22.5 + 33.75) x 1.2
//
// after the write, 130s in all, when each failed attempt fails at once (the endpoint refuses
// the connection or answers an error, as while kubescribe restarts). Attempts that time out
// (30s each, a node gone) can stretch it to DefaultFactMaxDelay.
const DefaultResumeGrace = 130 * time.Second

// DefaultCandidateSettle is how long after a change's watch event a confirmation by one user's
// admission candidates waits before it is final. A candidate is stored before the apiserver
// admits the write it names, but the apiserver calls the webhooks of concurrent requests in
// parallel and proceeds without a call that fails or times out (failurePolicy Ignore): the
// candidate of a second user sending the same write (the real author's, when its own call was
// slow) can be stored just after the first one's write is watched. Waiting this long, and
// looking again, makes such a race ambiguous (unresolved) instead of crediting whichever
// candidate came first. Admission-attributed changes are emitted this much later.
const DefaultCandidateSettle = time.Second

// lookupTimeout bounds one Redis lookup so a hung connection cannot hold a change past its grace.
const lookupTimeout = 2 * time.Second

// factSource is what the joiner needs from the fact store.
type factSource interface {
	Lookup(ctx context.Context, route, uid, rv string, isDelete bool) (*audit.Fact, error)
	Announcements(ctx context.Context) <-chan string
}

// JoinerOptions configures a Joiner.
type JoinerOptions struct {
	Facts   factSource
	Grace   time.Duration // <= 0 means DefaultGrace
	Logger  *slog.Logger  // nil means slog.Default()
	Metrics *Metrics      // may be nil
	// Excluded, when set, is told of each change dropped because its stream excludes the user
	// it is attributed to (for metrics). It must not block.
	Excluded func(watch.Change)
	// Candidates reads admission candidates; required when any cluster's source includes
	// admission.
	Candidates candidateSource
	// Source is the attribution source of every cluster SetSource was not called for; ""
	// means SourceAudit.
	Source Source
	// ResumeGrace is how long a change whose fact the apiserver may still be retrying waits
	// for it (DefaultResumeGrace has the arithmetic); <= 0 means DefaultResumeGrace. It is
	// never shorter than Grace.
	ResumeGrace time.Duration
	// Deliveries tells whether a live change's audit batch may have failed (audit.Deliveries);
	// nil: never.
	Deliveries deliveryDoubt
	// ReviewLosses tells whether an admission review of a change's cluster may have been lost
	// around it (admission.Losses): a change then confirmed by one user's candidates only is
	// unresolved, since the lost review may have been its real author's. nil: never.
	ReviewLosses deliveryDoubt
	// WaitClock records when a change first began to wait for a fact the apiserver may still
	// be retrying (Store.WaitingSince), so that a restart does not start the wait over; nil:
	// each process starts it when it sees the change.
	WaitClock waitClock
	// CandidateSettle is how long after its watch event a change confirmed by one user's
	// candidates waits before that is final (DefaultCandidateSettle says why); <= 0 means
	// DefaultCandidateSettle. It is never longer than Grace.
	CandidateSettle time.Duration
}

// deliveryDoubt is what the joiner needs to know of the audit deliveries; audit.Deliveries
// implements it.
type deliveryDoubt interface {
	Doubtful(route string, observed time.Time) bool
}

// waitClock is what the joiner needs to keep a long wait's start across restarts; Store
// implements it.
type waitClock interface {
	WaitingSince(ctx context.Context, route, uid, rv string, isDelete bool, now time.Time, ttl time.Duration) (time.Time, error)
}

// Joiner attributes watch changes to the users who made them. Each change waits for its fact on
// its own — woken by the fact's announcement, not by polling — so one object waiting never holds
// up another; changes of one object are emitted in the order they were observed.
type Joiner struct {
	facts factSource
	grace time.Duration
	// resumeGrace, deliveries and clock: the long wait for a fact the apiserver may still be
	// retrying (JoinerOptions). stopping is closed by Abandon.
	resumeGrace time.Duration
	// settle: JoinerOptions.CandidateSettle.
	settle     time.Duration
	deliveries deliveryDoubt
	losses     deliveryDoubt
	clock      waitClock
	stopping   chan struct{}
	stopOnce   sync.Once
	log        *slog.Logger
	metrics    *Metrics
	excluded   func(watch.Change)
	// candidates reads admission candidates; source is the default source, sources the
	// per-cluster ones (guarded by mu).
	candidates candidateSource
	source     Source
	sources    map[string]Source

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{} // "<route>/<uid>" -> wake-up channels
	tails   map[string]chan struct{}              // object path -> closed once its newest change is emitted
	// waitersPeak and tailsPeak are the most entries waiters and tails held since they were
	// last made: a Go map keeps the room of its largest size, so one drained after a burst is
	// made anew (shrinkAfter).
	waitersPeak, tailsPeak int
	// inFlight counts, per GitTarget, the changes passed to Join and not emitted (or dropped)
	// yet.
	inFlight map[types.NamespacedName]int
	// drained marks the targets whose in-flight count fell to zero (Drained).
	drained *notify.Set[types.NamespacedName]
	wg      sync.WaitGroup

	// listed queues listed changes for the goroutine resolving them (listing tells it runs).
	listMu  sync.Mutex
	listed  []joinItem
	listing bool
	// listOutageUntil (Unix ns): listed changes are not looked up before it, after a failure.
	listOutageUntil atomic.Int64
}

// NewJoiner returns a Joiner. Run must be running for announcements to wake waiting changes.
func NewJoiner(opts JoinerOptions) (*Joiner, error) {
	if opts.Facts == nil {
		return nil, errors.New("attribution: JoinerOptions.Facts is required")
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.ResumeGrace <= 0 {
		opts.ResumeGrace = DefaultResumeGrace
	}
	opts.ResumeGrace = max(opts.ResumeGrace, opts.Grace)
	if opts.CandidateSettle <= 0 {
		opts.CandidateSettle = DefaultCandidateSettle
	}
	opts.CandidateSettle = min(opts.CandidateSettle, opts.Grace)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Source == "" {
		opts.Source = SourceAudit
	}
	if _, err := ParseSource(string(opts.Source)); err != nil {
		return nil, fmt.Errorf("attribution: JoinerOptions.Source: %w", err)
	}
	if opts.Source.admission() && opts.Candidates == nil {
		return nil, errors.New("attribution: JoinerOptions.Candidates is required with an admission source")
	}
	return &Joiner{
		candidates: opts.Candidates,
		source:     opts.Source,
		sources:    map[string]Source{},
		facts:      opts.Facts,
		grace:      opts.Grace,

		resumeGrace: opts.ResumeGrace,
		settle:      opts.CandidateSettle,
		deliveries:  opts.Deliveries,
		losses:      opts.ReviewLosses,
		clock:       opts.WaitClock,
		stopping:    make(chan struct{}),

		log:      opts.Logger,
		metrics:  opts.Metrics,
		excluded: opts.Excluded,
		waiters:  map[string]map[chan struct{}]struct{}{},
		tails:    map[string]chan struct{}{},
		inFlight: map[types.NamespacedName]int{},
		drained:  notify.NewSet[types.NamespacedName](),
	}, nil
}

// Run delivers fact announcements to waiting changes until ctx ends.
func (j *Joiner) Run(ctx context.Context) error {
	for id := range j.facts.Announcements(ctx) {
		j.mu.Lock()
		for w := range j.waiters[id] {
			select {
			case w <- struct{}{}:
			default: // already woken; it will look again
			}
		}
		j.mu.Unlock()
	}
	return nil
}

// Join attributes c in the background and calls emit with the result, at the latest after the
// grace window. emit is called from a goroutine of the joiner, once per change, and for changes
// of one object path (cluster, resource, namespace, name) in the order Join was called.
func (j *Joiner) Join(c watch.Change, emit func(AttributedChange)) {
	if c.Op == watch.OpSweep {
		// Not an object's change: it is handed on at once, from the caller's goroutine, so it
		// reaches the writer before any change the stream emits after it.
		emit(AttributedChange{Change: c})
		return
	}
	// Changes are delivered in order per object path, not per uid: an object deleted and
	// created again under its name has two uids, and its re-creation must not overtake the
	// delete, which would then remove the new file.
	key := c.Cluster + "/" + c.UID
	seq := c.Cluster + "/" + c.GVR.Group + "/" + c.GVR.Resource + "/" + c.Namespace + "/" + c.Name
	done := make(chan struct{})
	j.mu.Lock()
	prev := j.tails[seq]
	j.tails[seq] = done
	j.tailsPeak = max(j.tailsPeak, len(j.tails))
	j.inFlight[c.Target]++
	j.mu.Unlock()
	if j.metrics != nil {
		j.metrics.pending.Inc()
	}

	j.wg.Add(1)
	item := joinItem{key: key, seq: seq, c: c, prev: prev, done: done, emit: emit}
	if c.Snapshot && !c.Resumed && prev == nil {
		// A listed change is looked up once, without waiting. A list hands over thousands at
		// once: they are resolved one after another by one goroutine rather than by a goroutine
		// each, whose stacks alone would take a hundred megabytes for 10,000 objects.
		j.listMu.Lock()
		j.listed = append(j.listed, item)
		start := !j.listing
		j.listing = true
		j.listMu.Unlock()
		if start {
			go j.resolveListed()
		}
		return
	}
	go j.deliver(item)
}

// shrinkAfter is the size above which a map of the joiner is made anew once it is empty: a
// snapshot of 10,000 objects leaves a 10,000-entry map's room (~400 KB) behind otherwise.
const shrinkAfter = 1024

// listOutagePause is how long listed changes are not looked up after a lookup failed.
const listOutagePause = 5 * time.Second

// joinItem is one change on its way through the join.
type joinItem struct {
	key, seq string
	c        watch.Change
	prev     chan struct{} // closed once the previous change of the object path is emitted
	done     chan struct{} // closed once this one is
	emit     func(AttributedChange)
	// listed is when a listed change's first look found no fact (resolveListed).
	listed time.Time
}

// resolveListed resolves queued listed changes until none is left. A listed change that no
// fact explains yet gets one more look once the grace window since it was listed has passed: an
// object written just before its stream listed it (a user's create racing a new GitTarget) has
// its fact on the way, and is that user's change, not the committer's snapshot.
func (j *Joiner) resolveListed() {
	var later []joinItem // first looks found nothing yet; oldest first
	for {
		j.listMu.Lock()
		batch := j.listed
		j.listed = nil
		if len(batch) == 0 && len(later) == 0 {
			j.listing = false
			j.listMu.Unlock()
			return
		}
		j.listMu.Unlock()
		for _, it := range batch {
			src := j.sourceOf(it.c.Cluster)
			a, again := j.lookupListed(it.c, src)
			if again {
				it.listed = time.Now()
				later = append(later, it)
				continue
			}
			j.finish(it, a, false)
		}
		if len(batch) > 0 || len(later) == 0 {
			continue // first looks before second ones
		}
		time.Sleep(time.Until(later[0].listed.Add(j.grace)))
		now := time.Now()
		n := 0
		for n < len(later) && !later[n].listed.Add(j.grace).After(now) {
			it := later[n]
			a, _ := j.lookupListed(it.c, j.sourceOf(it.c.Cluster))
			if !a.Resolved {
				j.metrics.observe("snapshot", 0)
			}
			j.finish(it, a, false)
			n++
		}
		later = later[n:]
	}
}

// deliver resolves a change's author, waits for the previous change of its object path and
// emits it.
func (j *Joiner) deliver(it joinItem) {
	author, abandoned := j.resolve(it.key, it.c)
	j.finish(it, author, abandoned)
}

// finish waits for the previous change of it's object path and emits it with author. A change
// abandoned at shutdown (Abandon) is not emitted: its stream's cursor does not cover it, so the
// next start finds it again.
func (j *Joiner) finish(it joinItem, author Author, abandoned bool) {
	defer j.wg.Done()
	c := it.c
	if it.prev != nil {
		<-it.prev
	}
	if author.Resolved || c.Resumed {
		// A change found by a list that a fact explains is that user's change like any
		// other; so is one the cursor shows somebody made while nothing watched, found
		// or not. Only what nobody is known to have changed stays the committer's snapshot.
		c.Snapshot = false
	}
	switch {
	case abandoned:
	case author.Resolved && slices.Contains(c.ExcludeUsers, author.Username):
		// The rule does not mirror this user's writes; an unresolved author is never
		// excluded. What a list found is state, though, and stays in the folder.
		state, kind := excludedState(it.c)
		if kind != stateFirstList && j.excluded != nil {
			j.excluded(c)
		}
		if kind != stateNone {
			it.emit(AttributedChange{Change: state})
		}
	default:
		it.emit(AttributedChange{Change: c, Author: author})
	}
	close(it.done)
	j.mu.Lock()
	if j.tails[it.seq] == it.done {
		delete(j.tails, it.seq)
		if len(j.tails) == 0 && j.tailsPeak > shrinkAfter {
			j.tails, j.tailsPeak = map[string]chan struct{}{}, 0
		}
	}
	empty := false
	if j.inFlight[c.Target]--; j.inFlight[c.Target] <= 0 {
		delete(j.inFlight, c.Target)
		empty = true
	}
	j.mu.Unlock()
	if empty {
		j.drained.Mark(c.Target)
	}
	if j.metrics != nil {
		j.metrics.pending.Dec()
	}
}

type excludedKind int

const (
	stateNone      excludedKind = iota // a live write, or an object created while nothing watched
	stateFirstList                     // found by a stream's first list: the state, written as is
	stateIfMissing                     // the folder holds an older version: restored if lost
)

// excludedState is what remains to write of change c (as the watch emitted it) once its author
// turned out to be an excluded user: the user's write is not mirrored, but an exclusion never
// takes state out of the folder. A stream's first list (no cursor) hands the state over, written
// as the committer's snapshot. An object whose older version the folder holds (a resume or a
// replay found the excluded write) is written only where the branch lost its file
// (watch.Change.IfMissing). A live write, a delete, and an object created while nothing watched
// leave nothing, as a live excluded write does.
func excludedState(c watch.Change) (watch.Change, excludedKind) {
	switch {
	case !c.Snapshot || c.Op == watch.OpDelete:
		return c, stateNone
	case !c.Resumed:
		return c, stateFirstList
	case c.Op == watch.OpUpdate:
		c.Resumed, c.Unchanged, c.IfMissing = false, true, true
		return c, stateIfMissing
	}
	return c, stateNone
}

// InFlight is the number of target's changes passed to Join that are not emitted yet (a sweep
// is emitted at once and never counts). Once it is zero, every change the watch emitted for
// the target before has reached emit: a retarget uses it to tell that its snapshot left the
// join.
func (j *Joiner) InFlight(target types.NamespacedName) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.inFlight[target]
}

// Drained signals that the in-flight count of some targets fell to zero; DrainedTargets then
// says which. The controller follows it instead of polling InFlight. Never closed.
func (j *Joiner) Drained() <-chan struct{} { return j.drained.C() }

// DrainedTargets returns, and forgets, the targets whose in-flight count fell to zero since
// the last call.
func (j *Joiner) DrainedTargets() []types.NamespacedName { return j.drained.Take() }

// Wait blocks until every change passed to Join has been emitted or ctx ends. Joins end by
// themselves within the grace window, so a shutdown that waits here finishes in-flight work.
func (j *Joiner) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resolve finds the author of c. A live change waits up to the grace window for its fact; a
// snapshot change that its stream's cursor shows happened while nothing watched (Resumed), and a
// live change whose audit batch may have failed, wait as long as the apiserver may still retry
// that batch (the resume grace); any other snapshot change is looked up once, except an
// Unchanged one, which nobody changed. A snapshot change without a fact has no author: the
// writer credits it to the committer. A change that finds no fact otherwise is unresolved.
// abandoned is true for a change that gave up its long wait because the joiner is stopping.
func (j *Joiner) resolve(key string, c watch.Change) (author Author, abandoned bool) {
	src := j.sourceOf(c.Cluster)
	if len(c.SealedFor) > 0 && c.Digest != ([32]byte{}) && j.candidates != nil {
		// A sealed Secret's create or update: its audit event (Metadata level) names no
		// post-write version, so no fact can name its author; a candidate with the same keyed
		// digest does, where the webhook covers Secrets. (A delete carries no digest: its fact
		// names its uid.)
		src = SourceAdmission
	}
	if c.Snapshot && !c.Resumed {
		a, again := j.lookupListed(c, src)
		if again {
			j.metrics.observe("snapshot", 0)
		}
		return a, false
	}
	if c.Snapshot && !src.audit() {
		// Changed while nothing watched, on a cluster without audit facts: the admission
		// candidate of its write was lost with the webhook call (nothing retries it), and a
		// candidate cannot confirm a write whose base version nobody saw.
		j.metrics.observe("unresolved", 0)
		return Unresolved(), false
	}
	start := time.Now()
	wake := make(chan struct{}, 1)
	j.register(key, wake)
	defer j.unregister(key, wake)

	deadline := start.Add(j.grace)
	var long string // why the change waits the resume grace: a resumeReason, or "" while it does not
	var stopping <-chan struct{}
	lengthen := func(reason string, seen time.Time) {
		long, stopping = reason, j.stopping
		if end := j.waitingSince(c, seen).Add(j.resumeGrace); end.After(deadline) {
			deadline = end
		}
		j.metrics.resumeWaiting(1)
	}
	switch {
	case c.Snapshot:
		lengthen(resumeResumed, start)
	case c.Replayed && src.audit():
		// Its audit batch may have gone to the owner that was lost. An admission candidate
		// is stored before the write it names is admitted: it is there already, or never.
		lengthen(resumeReplayed, start)
	}
	defer func() {
		if long != "" {
			j.metrics.resumeWaiting(-1)
			j.metrics.resumeWaitEnded(long, author.Resolved, abandoned)
		}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	// settled: when a confirmation by one user's candidates is final (DefaultCandidateSettle),
	// counted from the change's event; settle fires then, while such a confirmation waits.
	event := c.Observed
	if event.IsZero() || event.After(start) {
		event = start
	}
	settled := event.Add(j.settle)
	var settle <-chan time.Time
	lookupFailed := false
	fact := func() (Author, bool) {
		if !src.audit() {
			return Author{}, false
		}
		f, err := j.lookupErr(c)
		lookupFailed = lookupFailed || err != nil
		if f == nil {
			return Author{}, false
		}
		j.metrics.observe("resolved", time.Since(start))
		j.metrics.resolvedBy(SourceAudit)
		return authorFrom(f), true
	}
	for {
		if a, ok := fact(); ok {
			return a, false
		}
		if src == SourceAdmission {
			// Admission alone: a confirmed candidate is the answer, once settled; with both
			// sources an audit fact may still come and wins, so the candidate waits for the
			// deadline.
			a, ok := j.confirmed(c, start, settled)
			if ok {
				return a, false
			}
			if a.Resolved && settle == nil {
				st := time.NewTimer(time.Until(settled))
				defer st.Stop()
				settle = st.C
			}
		}
		select {
		case <-wake:
			continue
		case <-settle:
			continue
		case <-stopping:
			return Author{}, true
		case <-timer.C:
		}
		// The deadline. One last look: the announcement may have been lost (a publish is
		// best effort).
		if a, ok := fact(); ok {
			return a, false
		}
		if src.admission() {
			if a, ok := j.confirmed(c, start, time.Time{}); ok {
				return a, false
			}
		}
		if long == "" && src.audit() && (lookupFailed || j.deliveries != nil && j.deliveries.Doubtful(c.Cluster, c.Observed)) {
			// The batch with this change's fact may have failed (kubescribe was not reachable
			// yet, Redis failed): the apiserver retries it, for longer than the grace window.
			observed := c.Observed
			if observed.IsZero() || observed.After(start) {
				observed = start
			}
			lengthen(resumeDelivery, observed)
			timer.Reset(time.Until(deadline))
			continue
		}
		j.metrics.observe("unresolved", time.Since(start))
		waited := j.grace
		if long != "" {
			waited = time.Since(start).Round(time.Second)
		}
		j.log.Info("no fact or confirmed candidate in time; author is unresolved",
			"cluster", c.Cluster, "resource", c.GVR.Resource, "namespace", c.Namespace,
			"name", c.Name, "uid", c.UID, "resourceVersion", c.ResourceVersion, "op", c.Op,
			"source", src, "waited", waited, "resumed", c.Snapshot, "replayed", c.Replayed)
		return Unresolved(), false
	}
}

// lookupListed looks up, once, the author of a change a stream's list found without a cursor
// that shows it changed. again reports that no fact was found although one may still come (the
// caller counts the snapshot when it gives up); without it, the answer is final and counted.
func (j *Joiner) lookupListed(c watch.Change, src Source) (a Author, again bool) {
	if c.Unchanged {
		// The folder held this version at the last push: nobody changed it, so there is
		// no fact to look for. If the writer has to write it again, that is a snapshot.
		j.metrics.observe("snapshot", 0)
		return Author{}, false
	}
	if !src.audit() {
		// A listed change has no base version: no admission candidate can confirm it.
		j.metrics.observe("snapshot", 0)
		return Author{}, false
	}
	// Listed changes are looked up one after another; while Redis fails, they are not
	// looked up at all for a while, so that a list of thousands does not wait out a
	// timeout each.
	if time.Now().UnixNano() < j.listOutageUntil.Load() {
		j.metrics.observe("snapshot", 0)
		return Author{}, false
	}
	f, err := j.lookupErr(c)
	switch {
	case f != nil:
		j.metrics.observe("resolved", 0)
		j.metrics.resolvedBy(SourceAudit)
		return authorFrom(f), false
	case err != nil:
		j.listOutageUntil.Store(time.Now().Add(listOutagePause).UnixNano())
		j.metrics.observe("snapshot", 0)
		return Author{}, false
	}
	return Author{}, true
}

// The reasons a change waits the resume grace.
const (
	resumeResumed  = "resumed"  // changed while nothing watched
	resumeReplayed = "replayed" // an event a resumed stream replayed: its batch may have gone to the lost owner
	resumeDelivery = "delivery" // a live change whose audit batch may have failed
)

// waitingSince is when c first began to wait for a fact the apiserver may still be retrying:
// seen, unless an earlier wait of the same change (before a restart) was recorded.
func (j *Joiner) waitingSince(c watch.Change, seen time.Time) time.Time {
	if j.clock == nil {
		return seen
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	t, err := j.clock.WaitingSince(ctx, c.Cluster, c.UID, c.ResourceVersion, c.Op == watch.OpDelete, seen, j.resumeGrace+time.Minute)
	if err != nil {
		// Debug: with Redis away every waiting change says so; the outage is logged elsewhere.
		j.log.Debug("cannot read or record when a change began to wait; its wait starts now", "err", err, "uid", c.UID)
		return seen
	}
	return t
}

// Abandon ends the long waits: every change waiting for a fact the apiserver may still be
// retrying gives up at once and is not emitted, and so does every change that would begin such
// a wait from now on. Its stream's cursor does not cover it, so the next start finds it again
// (and, with a WaitClock, goes on waiting from where this one was). Changes in their grace
// window are not affected. Called at shutdown, before Wait.
func (j *Joiner) Abandon() {
	j.stopOnce.Do(func() { close(j.stopping) })
}

// confirmed looks for the candidates confirming c: ok is true once the answer is final, a
// confirmed candidate's author or, when candidates of different users match, unresolved. A
// confirmation before settled is not final yet: its author is returned with ok false.
func (j *Joiner) confirmed(c watch.Change, start, settled time.Time) (Author, bool) {
	switch res, a := j.confirm(c); res {
	case confirmed:
		if time.Now().Before(settled) {
			return a, false
		}
		observed := c.Observed
		if observed.IsZero() || observed.After(start) {
			observed = start
		}
		if j.losses != nil && j.losses.Doubtful(c.Cluster, observed) {
			// A review of this cluster was lost around the change: the real author's
			// candidate may be the one lost, and this one forged by whoever holds the
			// route's credential, who can cause the loss (issue 36, finding 1).
			j.metrics.observe("unresolved", time.Since(start))
			j.metrics.reviewLostInc()
			j.log.Info("an admission review of the cluster was lost around the change; one user's candidates do not name its author",
				"cluster", c.Cluster, "resource", c.GVR.Resource, "namespace", c.Namespace,
				"name", c.Name, "uid", c.UID, "resourceVersion", c.ResourceVersion, "op", c.Op)
			return Unresolved(), true
		}
		j.metrics.observe("resolved", time.Since(start))
		j.metrics.resolvedBy(SourceAdmission)
		return a, true
	case ambiguous:
		j.metrics.observe("unresolved", time.Since(start))
		j.metrics.ambiguousInc(false)
		j.log.Info("admission candidates of different users match the change; author is unresolved",
			"cluster", c.Cluster, "resource", c.GVR.Resource, "namespace", c.Namespace,
			"name", c.Name, "uid", c.UID, "resourceVersion", c.ResourceVersion, "op", c.Op)
		return Unresolved(), true
	case overflowed:
		j.metrics.observe("unresolved", time.Since(start))
		j.metrics.ambiguousInc(true)
		j.log.Warn("more admission candidates than the bound for the change's base version; author is unresolved",
			"cluster", c.Cluster, "resource", c.GVR.Resource, "namespace", c.Namespace,
			"name", c.Name, "uid", c.UID, "resourceVersion", c.ResourceVersion, "op", c.Op, "bound", MaxCandidates)
		return Unresolved(), true
	}
	return Author{}, false
}

func (j *Joiner) lookup(c watch.Change) *audit.Fact {
	f, _ := j.lookupErr(c)
	return f
}

// lookupErr looks c's fact up; a failed lookup is logged and counted.
func (j *Joiner) lookupErr(c watch.Change) (*audit.Fact, error) {
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	f, err := j.facts.Lookup(ctx, c.Cluster, c.UID, c.ResourceVersion, c.Op == watch.OpDelete)
	if err != nil {
		j.log.Warn("attribution lookup failed", "err", err, "uid", c.UID)
		if j.metrics != nil {
			j.metrics.lookupErrors.Inc()
		}
		return nil, err
	}
	return f, nil
}

func (j *Joiner) register(key string, w chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	set := j.waiters[key]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		j.waiters[key] = set
		j.waitersPeak = max(j.waitersPeak, len(j.waiters))
	}
	set[w] = struct{}{}
}

func (j *Joiner) unregister(key string, w chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.waiters[key], w)
	if len(j.waiters[key]) == 0 {
		delete(j.waiters, key)
		if len(j.waiters) == 0 && j.waitersPeak > shrinkAfter {
			j.waiters, j.waitersPeak = map[string]map[chan struct{}]struct{}{}, 0
		}
	}
}

func authorFrom(f *audit.Fact) Author {
	return Author{Identity: f.User, Resolved: true, AuditID: f.AuditID, Verb: f.Verb, Source: string(SourceAudit)}
}

// Unresolved is the explicit author of a change no fact explains.
func Unresolved() Author {
	return Author{Identity: audit.Identity{Username: UnresolvedUsername}}
}
