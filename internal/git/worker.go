package git

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
)

// PushResult describes one successful push.
type PushResult struct {
	// Commits delivered by this push, oldest first.
	Commits []CommitInfo
	// Settled are changes that made no commit because the branch already held them; they are
	// reported once nothing before them is left unpushed, with a push or on their own.
	Settled []attribution.AttributedChange
}

// ReplayRequest says that the branch no longer holds what the worker pushed (Options.OnReplay).
type ReplayRequest struct {
	// Folders (folderKey) are folders whose content someone else's commits changed, or a
	// rewind or a replaced history took back; their GitTargets' streams hand their state over
	// again.
	Folders []string
	// StartedOver: the worker gave its branch up, because the server lost the branch's history
	// (see Worker.startOver); every folder of the branch is concerned. Dropped are the changes
	// it held then, committed or not: none of them is on the remote and their resume cursors
	// were never advanced, so their streams hand them over again.
	StartedOver bool
	Dropped     []attribution.AttributedChange
}

// CommitInfo is one commit and the changes it holds.
type CommitInfo struct {
	SHA     string
	Target  types.NamespacedName
	Changes []attribution.AttributedChange
	// Path is the target's folder the commit wrote to, and FolderTree the hash of that
	// folder's tree in the commit ("" when the commit left the folder empty).
	Path       string
	FolderTree string
	// Request is the ID of the close request that closed this commit's window, if any.
	Request string
}

// Status is a snapshot of a worker's state.
type Status struct {
	// LastPush is when the last successful push finished (Options.Now clock).
	LastPush time.Time
	// LastError is the last clone, fetch, commit or push error; nil after a successful push.
	// An operation cut short by the end of Run's context is no error. It never contains the
	// credentials.
	LastError error
	// Pending counts submitted changes that are not on the remote yet. After Run returned, it is
	// the number of changes Run did not push.
	Pending int
}

const (
	// maxRebaseRounds bounds how often one push cycle rebuilds on a moving remote before it
	// backs off.
	maxRebaseRounds = 3
	// historyScanSlack is how many commits, beyond the pending ones, refetch inspects in the
	// history of a new remote tip to find pending commits that an earlier push delivered.
	historyScanSlack = 300
	// rewindScanLimit bounds the search for a new remote tip in the old remote tip's history,
	// which tells a rewound branch from one that moved on. The worker keeps the hashes (not the
	// objects) of that many commits of history.
	rewindScanLimit = 1000
	// maxUnpushedCommits bounds the commits built ahead of a push (32: measured with
	// test/snapshotload, no slower than 64 and 50 MiB lower at the peak). Each commit holds every tree
	// it rewrote (a directory of 10,000 objects is a 420 KB tree); under a steady stream from
	// several authors, thousands of commits built while one push runs would hold gigabytes.
	// The rest of the queue waits as submissions, which hold only their manifests.
	maxUnpushedCommits = 32
	// compactSlack is how many objects the working store may gain before it is compacted back
	// to the tip's trees, once nothing is unpushed.
	compactSlack = 4096
	// compactBytes is how many bytes of objects the working store may gain before it is
	// compacted back, whatever their number.
	compactBytes = 2 << 20
	// replayWait bounds how long a worker that started its branch over (startOver) holds its
	// commits back while no snapshot change has reached it: the streams' whole state is on its
	// way, and the branch should not be created again with only the changes that came first.
	replayWait = time.Minute
	// idleTrimAfter is how long a worker with nothing to do waits before it lets go of what
	// only speeds up its next commits: the working store is cut back (compact)
	// and the parsed trees of the last commit are dropped. After 10,000 commits into a
	// 10,000-object folder that is ~1.4 MB (an index of the folder's names, superseded trees),
	// which the snapshot before them had not left. It is shorter than the quiet time after
	// which cmd/server returns free memory to the OS, so what it frees is returned too.
	idleTrimAfter = 5 * time.Second
	// defaultOpTimeout bounds one clone, fetch or push.
	defaultOpTimeout = 2 * time.Minute
	// defaultFinalTimeout bounds the last push attempt when Run's context ends.
	defaultFinalTimeout = 30 * time.Second
	backoffStart        = time.Second
	backoffCap          = time.Minute
)

// defaultBackoff doubles from 1s up to 1m.
func defaultBackoff(attempt int) time.Duration {
	d := backoffStart
	for i := 1; i < attempt && d < backoffCap; i++ {
		d *= 2
	}
	return min(d, backoffCap)
}

type submission struct {
	targetPath string
	change     attribution.AttributedChange
	// close, when set, is a close request instead of a change (RequestClose).
	close *CloseRequest
	// forget, when set, is a ForgetFolder of targetPath instead of a change; prepare a
	// PrepareFolder.
	forget, prepare bool
}

// windowKey is what consecutive changes must share to go into one commit.
type windowKey struct {
	targetPath string
	target     types.NamespacedName
	snapshot   bool
	username   string
	resolved   bool
}

type window struct {
	key      windowKey
	opened   time.Time // real clock
	deadline time.Time // real clock
	changes  []attribution.AttributedChange
	// request is the close request that closes the window, if any.
	request *CloseRequest
}

// Worker is the single writer of one branch of one remote repository. It gathers submitted
// changes into commits, builds them in a small in-memory working store (the branch tip's trees,
// not its history) and pushes them. Submit and
// Status may be called from any goroutine; Run runs the worker.
type Worker struct {
	opts   Options
	log    *slog.Logger
	branch plumbing.ReferenceName // refs/heads/<branch>

	// credsMu guards the credentials, which SetCredentials replaces while the worker runs.
	credsMu sync.RWMutex
	creds   Credentials
	// signer signs the worker's commits (nil: unsigned); SetSigner replaces it, under credsMu.
	signer Signer
	auth   transport.AuthMethod
	// retired are passwords this worker used before; errors are scrubbed of them too, since
	// an operation may have started with them.
	retired []string
	// web is the worker's HTTP(S) client (transport.go), built for the CA bundle webCA.
	webMu sync.Mutex
	web   *webClient

	// Test seams.
	backoff      func(attempt int) time.Duration
	opTimeout    time.Duration
	finalTimeout time.Duration
	compactEvery int                             // compactSlack
	idleTrim     time.Duration                   // idleTrimAfter
	gateRecheck  time.Duration                   // defaultGateRecheck
	gateBatch    int                             // blobBatch
	replayHold   time.Duration                   // replayWait
	pushFn       func(ctx context.Context) error // pushes the local branch; pushOnce

	running atomic.Bool
	wake    chan struct{}

	mu     sync.Mutex
	queue  []submission
	status Status
	// refusals are the folders that did not pass the gate, by folder (folderKey).
	refusals map[string]*FolderRefusedError
	stopping bool // shutdown began: the final commit is made, later submissions are not committed
	stopped  bool // Run returned: submissions are no longer queued
	// superseded is set once a newer writer took the branch over (supersede).
	superseded bool
	// epoch is the worker's writer epoch (writer.go); 0 without one. Set before the first clone.
	epoch int64
	// held is what the branch holds by the push records found at its tip when the worker
	// opened it and whenever a fetch found it moved (pushdelivery.go). Owned by the Run
	// goroutine.
	held onBranch

	// Owned by the Run goroutine.
	// store is the working object store: the tip's commit and trees, the objects of unpushed
	// commits, and what fetches added since the last compaction. nil until the first clone.
	store     *memory.Storage
	compactAt int // compact the store once it holds this many objects and nothing is unpushed
	// storeGrowth is the bytes of the objects commits wrote since the store was last replaced;
	// past compactBytes the store is compacted too (one commit into a large directory writes a
	// large tree).
	storeGrowth  int64
	compactBytes int64 // compactBytes; test seam
	trees        *treeCache
	gc           *storeGC // prunes store between full compactions
	// gates are the folder gates, by folder (folderKey).
	gates map[string]*folderGate
	// Values this worker last added to the shared gauges.
	gaugePlans, gaugeObjects int
	remoteTip                plumbing.Hash // remote branch as last seen; parent of the first unpushed commit
	// remoteSeen is when remoteTip was last learned from the remote (a clone, fetch or push).
	remoteSeen time.Time // real clock
	// recheck is set when a plan must be built on the remote branch as it is now, not as last
	// seen: its Unchanged changes make a commit only where the branch lost their files.
	recheck  bool
	localTip plumbing.Hash // newest local commit
	stale    bool          // plans must be rebuilt on remoteTip before pushing
	// remoteGone is set when a fetch found the remote branch deleted: the next push creates it
	// again, without requiring the remote branch to be at remoteTip.
	remoteGone bool
	// replayUntil is set by startOver: until a window of snapshot changes closed, or this time
	// passed without a snapshot change arriving, nothing is pushed. replaying is set once a
	// snapshot change arrived; the hold then lasts until its window closed.
	replayUntil time.Time // real clock; zero = no hold
	replaying   bool
	// final is set for the last push attempt of shutdown; before it, a remote operation failing
	// because Run's context ended is an interruption, not a failure.
	final bool
	win   *window
	plans []*plan // closed windows not yet pushed, oldest first
	// settled are changes that made no commit, waiting for the plans before them to be pushed.
	settled  []attribution.AttributedChange
	failures int
	retryAt  time.Time // real clock; zero = now
	// checkFailed is set while LastError is a failed folder check's.
	checkFailed bool
	// fetchEvery is Options.FetchInterval (a time.Duration), replaced by SetFetchInterval
	// while the worker runs; branchCheckFailed is set while LastError is a failed branch
	// check's (checkBranch).
	fetchEvery atomic.Int64
	// resign is set by SetSigner: the unpushed commits are built again with the new key.
	resign            atomic.Bool
	branchCheckFailed bool
	// idleSince is when the worker last found nothing to do (zero while it has work), and
	// trimmed whether it trimmed since (trimIfIdle).
	idleSince time.Time
	trimmed   bool
}

// NewWorker validates opts and returns a worker; nothing touches the remote before Run.
func NewWorker(opts Options) (*Worker, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	w := &Worker{
		opts:         opts,
		branch:       plumbing.NewBranchReferenceName(opts.Branch),
		backoff:      defaultBackoff,
		opTimeout:    defaultOpTimeout,
		finalTimeout: defaultFinalTimeout,
		compactEvery: compactSlack,
		idleTrim:     idleTrimAfter,
		compactBytes: compactBytes,
		gateRecheck:  defaultGateRecheck,
		gateBatch:    blobBatch,
		replayHold:   replayWait,
		trees:        newTreeCache(),
		gc:           newStoreGC(),
		gates:        map[string]*folderGate{},
		refusals:     map[string]*FolderRefusedError{},
		wake:         make(chan struct{}, 1),
	}
	w.pushFn = w.pushOnce
	w.fetchEvery.Store(int64(opts.FetchInterval))
	w.log = opts.Logger.With("component", "git", "url", opts.URL, "branch", opts.Branch)
	w.creds = opts.Credentials
	w.signer = opts.Signer
	w.auth, _ = authFor(opts.URL, opts.Credentials) // validate checked it
	if isHTTP(opts.URL) && !opts.Credentials.empty() && strings.HasPrefix(strings.ToLower(opts.URL), "http://") {
		w.log.Warn("credentials are sent over plain http; use https")
	}
	return w, nil
}

// Submit queues a change for the GitTarget folder targetPath. It never blocks, and while Run
// runs it never drops: the queue is unbounded.
//
// Once Run's context has ended, the worker makes its final commit of what it received until
// then; a change submitted later is not committed. It is logged as an error (its identity, never
// its content) and counted in kubescribe_git_dropped_changes_total. While Run is still
// returning, it also counts among the changes Run reports as not pushed; after Run returned, it
// is not queued at all.
func (w *Worker) Submit(targetPath string, c attribution.AttributedChange) {
	w.mu.Lock()
	stopping, stopped := w.stopping, w.stopped
	if w.superseded {
		// Another replica writes the branch; it observes this change itself.
		w.mu.Unlock()
		w.opts.Metrics.changeReleased()
		return
	}
	if !stopped {
		w.queue = append(w.queue, submission{targetPath: targetPath, change: c})
		w.status.Pending++
	}
	w.mu.Unlock()
	if stopping {
		w.opts.Metrics.changeDropped()
		msg := "change submitted to a stopping git worker; it is not committed"
		if stopped {
			msg = "change submitted to a stopped git worker; it is dropped"
		}
		w.log.Error(msg, "target", c.Target.String(), "resource", c.GVR.Resource,
			"namespace", c.Namespace, "name", c.Name, "op", c.Op)
	}
	if stopped {
		return
	}
	w.opts.Metrics.addPending(1)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Status reports the worker's state.
func (w *Worker) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Run clones the branch, then commits and pushes submitted changes until ctx is done. Then it
// commits the open window, makes one last bounded push attempt and returns; the error reports
// changes that could not be pushed. Run may be called once.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("git: Worker.Run may be called only once")
	}
	w.log.Info("git worker started")
	defer w.closeWeb()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		w.drain()
		if w.win != nil && !time.Now().Before(w.win.deadline) {
			w.closeWindow()
		}
		w.sync(ctx)
		if w.Superseded() {
			w.reportGauges(true)
			return nil
		}
		w.trimIfIdle()
		w.reportGauges(false)
		if ctx.Err() != nil {
			return w.shutdown(ctx)
		}
		if next, ok := w.nextWakeup(); ok {
			timer.Reset(time.Until(next))
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return w.shutdown(ctx)
		case <-w.wake:
		case <-timer.C:
		}
	}
}

// nextWakeup is the earliest of the window deadline and the next remote retry.
func (w *Worker) nextWakeup() (time.Time, bool) {
	var next time.Time
	if w.win != nil {
		next = w.win.deadline
	}
	needRemote := w.store == nil || w.stale || len(w.plans) > 0
	for _, g := range w.gates {
		if g.state == gateOpen {
			continue
		}
		needRemote = true
		if !g.checkAt.IsZero() && (next.IsZero() || g.checkAt.Before(next)) {
			next = g.checkAt
		}
	}
	if needRemote && w.retryAt.After(time.Now()) && (next.IsZero() || w.retryAt.Before(next)) {
		next = w.retryAt
	}
	if hold := w.replayUntil; !hold.IsZero() && !w.replaying && len(w.plans) > 0 && (next.IsZero() || hold.Before(next)) {
		next = hold
	}
	if !w.idleSince.IsZero() && !w.trimmed {
		if at := w.idleSince.Add(w.idleTrim); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if at, ok := w.branchCheckAt(); ok && (next.IsZero() || at.Before(next)) {
		next = at
	}
	return next, !next.IsZero()
}

// idle reports whether the worker has nothing to do: nothing queued, no open window, every
// commit pushed, its store up to date.
func (w *Worker) idle() bool {
	if w.store == nil || w.stale || w.win != nil || len(w.plans) > 0 || len(w.settled) > 0 {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue) == 0
}

// trimIfIdle lets go, once the worker has had nothing to do for idleTrim, of what only speeds
// up the next commits: objects the store gained since its last compaction (superseded trees,
// fetched objects) and the parsed trees of the last commit, with their name indexes. The next
// commit parses the trees it edits again.
func (w *Worker) trimIfIdle() {
	if !w.idle() {
		w.idleSince, w.trimmed = time.Time{}, false
		return
	}
	now := time.Now()
	if w.idleSince.IsZero() {
		w.idleSince = now
	}
	if w.trimmed || now.Sub(w.idleSince) < w.idleTrim {
		return
	}
	w.trimmed = true
	if len(w.store.Objects) > w.compactAt-w.compactEvery {
		w.compact()
	}
	flattenTrees(w.store)
	w.trees = newTreeCache()
	w.log.Debug("idle: working store trimmed", "objects", len(w.store.Objects))
}

// flattenTrees puts the content of every paged tree of s into one allocation. A stream of
// commits into a large directory leaves its tree in 4 KiB pages copied at different times, each
// alone in a heap span half used by then (a directory of 10,000 objects: 123 pages, 670 KB of
// spans, against 410 KB in one piece after a snapshot). The next commit pages it again.
func flattenTrees(s *memory.Storage) {
	for _, obj := range s.Trees {
		if o, ok := obj.(*rawObject); ok && o.c.paged() {
			o.c = flatContent(o.c.bytes())
		}
	}
}

// shutdown commits everything submitted so far, makes the last bounded push attempt and reports
// what it could not push.
func (w *Worker) shutdown(ctx context.Context) error {
	w.final = true
	// Taking the queue and marking the worker stopping at once: every change either makes the
	// final commit or is reported by Submit as not committed.
	w.mu.Lock()
	w.stopping = true
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	w.acceptAll(q)
	if w.win != nil {
		w.closeWindow()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.finalTimeout)
	defer cancel()
	w.retryAt = time.Time{}
	w.sync(fctx)

	// Drain once more: what arrived during the final push is not pushed, and is counted so.
	w.mu.Lock()
	w.stopped = true
	late := len(w.queue)
	w.queue = nil
	pending := w.status.Pending
	lastErr := w.status.LastError
	w.mu.Unlock()
	// Nothing of this worker is pending any more for the shared gauge: Run does not push it.
	w.opts.Metrics.addPending(-pending)
	w.reportGauges(true)
	if pending == 0 {
		w.log.Info("git worker stopped", "pending", 0)
		return nil
	}
	msg := fmt.Sprintf("git: %d changes not pushed to branch %q", pending, w.opts.Branch)
	if late > 0 {
		msg += fmt.Sprintf(" (%d of them submitted after shutdown began)", late)
	}
	if held := w.refusedChanges(); held > 0 {
		msg += fmt.Sprintf(" (%d of them held: their folder did not pass the folder check)", held)
		if lastErr == nil && held == pending-late {
			lastErr = errors.New("nothing else was left to push")
		}
	}
	var err error
	if pending > late {
		cause := lastErr
		if cause == nil {
			cause = errors.New("no push attempt succeeded")
		}
		err = fmt.Errorf("%s: %w", msg, cause)
	} else {
		err = errors.New(msg)
	}
	w.log.Warn("git worker stopped with changes not pushed", "pending", pending, "late", late, "err", err, "detail", RemoteDetail(err))
	return err
}

// reportGauges brings this worker's share of the unpushed-commits and store-objects gauges up to
// date; stopped removes it.
func (w *Worker) reportGauges(stopped bool) {
	plans, objects := len(w.plans), 0
	if w.store != nil {
		objects = len(w.store.Objects)
	}
	if stopped {
		plans, objects = 0, 0
	}
	w.opts.Metrics.addUnpushed(plans - w.gaugePlans)
	w.opts.Metrics.addStoreObjects(objects - w.gaugeObjects)
	w.gaugePlans, w.gaugeObjects = plans, objects
}

// drain moves queued submissions into commit windows.
func (w *Worker) drain() {
	w.mu.Lock()
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	for i, s := range q {
		if len(w.plans) >= maxUnpushedCommits {
			// Enough commits wait for a push: the rest stays queued, as submissions, until a
			// push made room (delivered wakes the loop again).
			w.mu.Lock()
			w.queue = append(q[i:len(q):len(q)], w.queue...)
			w.mu.Unlock()
			return
		}
		w.accept(s)
	}
}

func (w *Worker) acceptAll(q []submission) {
	for _, s := range q {
		w.accept(s)
	}
}

func (w *Worker) accept(s submission) {
	if s.forget {
		w.forgetGate(s.targetPath)
		return
	}
	if s.prepare {
		w.gateFor(s.targetPath)
		return
	}
	if s.close != nil {
		if g := w.heldFor(s.close.Target); g != nil {
			g.hold(s) // its target's changes wait for their folder: so does the request
			return
		}
		w.acceptClose(*s.close)
		return
	}
	c := s.change
	if err := validChange(s.targetPath, c.Change); err != nil {
		w.log.Error("change cannot be stored in git; skipped", "err", err,
			"resource", c.GVR.Resource, "namespace", c.Namespace, "name", c.Name, "resourceVersion", c.ResourceVersion)
		w.opts.Metrics.changeInvalid()
		w.addPending(-1)
		return
	}
	if g := w.gateFor(s.targetPath); g.state != gateOpen {
		g.hold(s)
		return
	}
	key := windowKey{targetPath: s.targetPath, target: c.Target, snapshot: c.Snapshot}
	if !c.Snapshot {
		key.username, key.resolved = c.Author.Username, c.Author.Resolved
	}
	if w.win != nil && (w.win.key != key || !w.windowOpen()) {
		w.closeWindow()
	}
	if w.win == nil {
		now := time.Now()
		w.win = &window{key: key, opened: now, deadline: now.Add(w.opts.CommitWindow)}
	}
	w.win.changes = append(w.win.changes, c)
	if c.Snapshot && !w.replayUntil.IsZero() {
		w.replaying = true
	}
}

// windowOpen reports whether the open window's deadline is still ahead.
func (w *Worker) windowOpen() bool { return w.win != nil && time.Now().Before(w.win.deadline) }

func (w *Worker) builder() treeBuilder {
	return treeBuilder{s: w.store, trees: w.trees, writer: writerTrailer(w.opts.WriterSlot, w.epoch), held: w.held, sign: w.currentSigner()}
}

func (w *Worker) committer() object.Signature {
	return object.Signature{Name: w.opts.Committer.Name, Email: w.opts.Committer.Email, When: w.opts.Now()}
}

// closeWindow turns the open window into a plan and, when the repository is ready, a commit.
func (w *Worker) closeWindow() {
	win := w.win
	w.win = nil
	if win.key.snapshot && w.replaying {
		w.replayUntil, w.replaying = time.Time{}, false // the replay's commit goes with the next push
	}
	p := newPlan(win.key.targetPath, win.changes, w.opts.Committer, w.opts.AuthorEmailDomain, w.opts.Now())
	if win.request != nil {
		p.applyRequest(win.request)
	}
	w.plans = append(w.plans, p)
	if w.store == nil || w.stale {
		return // materialized by the next rebuild
	}
	if w.remoteSeen.Before(win.opened) && checksBranch(p.changes) {
		// Someone else may have changed the folder since the remote was last seen: fetch first,
		// then build every unpushed plan on what the branch holds.
		w.recheck, w.stale = true, true
		return
	}
	sha, ok, err := w.builder().materialize(p, w.localTip, w.committer())
	w.noteDuplicates(p)
	if err != nil {
		w.stale = true
		w.setError(fmt.Errorf("build commit: %w", err))
		w.log.Error("build commit failed; retrying on the next rebuild", "err", w.redact(err))
		return
	}
	if !ok {
		w.plans = w.plans[:len(w.plans)-1]
		w.addPending(-len(p.changes))
		if p.request != nil {
			w.reportClose(p.request.ID, CloseNothingToCommit)
		}
		w.log.Debug("changes leave the tree unchanged; no commit", "changes", len(p.changes))
		w.settle(p.covered)
		return
	}
	w.committed(p, sha)
	w.gc.committed(w.store, sha, p.objects)
	w.setLocalTip(sha)
}

// noteDuplicates logs and counts, once per plan, the changes its materialization left out
// because the branch held them already (carried.go).
func (w *Worker) noteDuplicates(p *plan) {
	if p.duplicates == 0 || p.duplicatesNoted {
		return
	}
	p.duplicatesNoted = true
	w.opts.Metrics.replayDuplicates(p.duplicates)
	w.log.Info("changes the branch already holds from another writer's commits; not committed again",
		"target", p.target.String(), "changes", p.duplicates)
}

// checksBranch reports whether changes hold an Unchanged one: an object a resumed stream's
// cursor says the folder holds, which makes a commit only if the branch lost its file.
func checksBranch(changes []attribution.AttributedChange) bool {
	for _, c := range changes {
		if c.Unchanged {
			return true
		}
	}
	return false
}

func (w *Worker) committed(p *plan, sha plumbing.Hash) {
	p.sha = sha
	for _, o := range p.objects {
		if obj, err := w.store.EncodedObject(plumbing.AnyObject, o.hash); err == nil {
			w.storeGrowth += obj.Size()
		}
	}
	if !p.counted {
		p.counted = true
		w.opts.Metrics.commitCreated()
		if p.restored > 0 {
			w.log.Info("restoring files the branch lost since they were pushed", "target", p.target.String(), "files", p.restored)
		}
	}
	w.log.Debug("committed", "sha", sha.String(), "changes", len(p.changes), "author", p.author.Name)
}

// rebuild materializes every unpushed plan again, in order, on remoteTip.
func (w *Worker) rebuild() error {
	tip := w.remoteTip
	tb := w.builder()
	kept := make([]*plan, 0, len(w.plans))
	shas := make([]plumbing.Hash, 0, len(w.plans))
	dropped := 0
	for _, p := range w.plans {
		sha, ok, err := tb.materialize(p, tip, w.committer())
		w.noteDuplicates(p)
		if err != nil {
			return fmt.Errorf("build commit: %w", err)
		}
		if !ok {
			dropped += len(p.changes)
			w.settled = append(w.settled, p.covered...)
			w.log.Info("changes are already on the branch; no commit", "changes", len(p.changes), "author", p.author.Name)
			continue
		}
		kept = append(kept, p)
		shas = append(shas, sha)
		tip = sha
	}
	// The path counts describe the local tip: they follow the plans built on it when it was the
	// remote tip (after a clone), and are lost when the plans moved to another one.
	follow := w.localTip == w.remoteTip
	if !follow {
		w.gc.invalidate()
	}
	for i, p := range kept {
		w.committed(p, shas[i])
		if follow {
			w.gc.committed(w.store, shas[i], p.objects)
		}
	}
	w.plans = kept
	w.stale = false
	w.addPending(-dropped)
	w.setLocalTip(tip)
	// With no commit left to push, what the rebuild found on the branch is settled now; no
	// push would report it.
	w.settle(nil)
	return nil
}

func (w *Worker) setLocalTip(sha plumbing.Hash) {
	w.localTip = sha
	if !sha.IsZero() {
		if err := w.store.SetReference(plumbing.NewHashReference(w.branch, sha)); err != nil {
			w.log.Error("update local branch reference", "err", err)
		}
	}
}

// sync brings the remote up to date when a retry is due: clone, rebuild, push.
func (w *Worker) sync(ctx context.Context) {
	if w.resign.Swap(false) && w.store != nil && len(w.plans) > 0 {
		// The commits not pushed yet are signed again with the new key (or, when the key
		// cannot sign, held), now rather than after the backoff of a failure the old key
		// caused.
		w.stale, w.retryAt = true, time.Time{}
	}
	if time.Now().Before(w.retryAt) {
		return
	}
	if w.store == nil {
		if err := w.ensureEpoch(ctx); err != nil {
			w.failed(ctx, "take a writer epoch", err)
			return
		}
		if err := w.open(ctx); err != nil {
			w.failed(ctx, "clone", err)
			return
		}
	}
	if w.recheck {
		if _, err := w.refetch(ctx); err != nil {
			w.failed(ctx, "fetch", err)
			return
		}
		w.recheck = false
	}
	if w.stale {
		if err := w.rebuild(); err != nil {
			w.failed(ctx, "rebuild", err)
			return
		}
	}
	w.checkGates(ctx)
	if time.Now().Before(w.retryAt) {
		return // a check failed
	}
	w.checkBranch(ctx)
	if len(w.plans) > 0 && !w.holding() {
		w.push(ctx)
	}
	w.compactIfDue()
}

// holding reports whether the commits wait for the streams' replay after a startOver (see
// replayUntil).
func (w *Worker) holding() bool {
	if w.replayUntil.IsZero() {
		return false
	}
	if !w.replaying && !time.Now().Before(w.replayUntil) {
		w.log.Warn("no snapshot arrived after the branch was started over; pushing what there is", "waited", w.replayHold)
		w.replayUntil = time.Time{}
		return false
	}
	return true
}

// push pushes the unpushed commits; on a non-fast-forward it fetches, rebuilds them on the new
// remote tip and tries again.
func (w *Worker) push(ctx context.Context) {
	rebuilds := 0
	for len(w.plans) > 0 {
		w.recordPush(ctx)
		start := time.Now()
		err := w.pushFn(ctx)
		if err == nil {
			w.remoteSeen = start // the branch was our tip's parent then
			w.opts.Metrics.pushed(pushResultSuccess, time.Since(start))
			w.delivered(len(w.plans))
			return
		}
		if w.interrupted(ctx) {
			w.log.Info("push interrupted by shutdown; the final push attempt follows", "err", w.redact(err))
			return
		}
		if errors.Is(err, errHistoryLost) {
			w.opts.Metrics.pushed(pushResultError, time.Since(start))
			if w.final {
				// No replay follows a shutdown: the changes stay what Run reports unpushed,
				// and the next start, finding the branch missing, writes them again.
				w.failed(ctx, "push", err)
				return
			}
			w.startOver(err)
			return
		}
		changed, ferr := w.refetch(ctx)
		if ferr != nil || !changed {
			if ferr != nil {
				err = errors.Join(err, fmt.Errorf("fetch: %w", ferr))
			}
			if w.interrupted(ctx) {
				w.log.Info("push interrupted by shutdown; the final push attempt follows", "err", w.redact(err))
				return
			}
			w.opts.Metrics.pushed(pushResultError, time.Since(start))
			w.failed(ctx, "push", err)
			return
		}
		if !w.stale {
			// The remote already holds some of our commits (an earlier push landed although it
			// reported an error), or it lost the branch and the next push creates it again: push
			// at once. This is no rebuild and does not count against maxRebaseRounds; each such
			// round delivers commits or, once, drops the requirement on the deleted branch, so
			// the loop ends.
			w.opts.Metrics.pushed(pushResultError, time.Since(start))
			continue
		}
		w.opts.Metrics.pushed(pushResultRejected, time.Since(start))
		if len(w.plans) > 0 {
			w.log.Info("remote branch moved; rebuilding unpushed commits on its tip",
				"remote_tip", w.remoteTip.String(), "commits", len(w.plans))
		}
		if err := w.rebuild(); err != nil {
			w.failed(ctx, "rebuild", err)
			return
		}
		rebuilds++
		if len(w.plans) > 0 && rebuilds >= maxRebaseRounds {
			w.failed(ctx, "push", fmt.Errorf("remote branch kept moving: %w", err))
			return
		}
	}
	w.failures, w.retryAt = 0, time.Time{}
}

// startOver gives the branch up and starts it again from nothing, after the server refused to
// take it back on its old history (errHistoryLost): someone deleted the branch and the server
// garbage-collected its objects. The worker's commits build on trees the server no longer
// holds, and the worker keeps no blobs to send them again, so it drops every change it holds:
// committed and unpushed, settled, in the open window and queued. None of them is on the
// remote, and no resume cursor was advanced past them. The next sync opens the missing branch
// (an empty store). OnReplay reports StartedOver, upon which the streams of the worker's targets
// hand their whole state over again (Router.TargetStatus.StartOvers): unchanged objects write
// every file again, and the dropped changes come back with their authors. Nothing is pushed
// until that replay's commit is built (holding), so the branch does not come back with only
// the changes that happened to come first.
func (w *Worker) startOver(err error) {
	var dropped []attribution.AttributedChange
	pending := 0
	lost := func(req *CloseRequest) {
		if req != nil {
			w.reportClose(req.ID, CloseLost)
		}
	}
	for _, p := range w.plans {
		dropped = append(dropped, p.changes...)
		pending += len(p.changes)
		lost(p.request)
	}
	dropped = append(dropped, w.settled...)
	if w.win != nil {
		dropped = append(dropped, w.win.changes...)
		pending += len(w.win.changes)
		lost(w.win.request)
	}
	w.mu.Lock()
	kept := w.queue[:0:0]
	for _, s := range w.queue {
		if s.forget || s.prepare || s.close != nil {
			kept = append(kept, s) // folder bookkeeping and requests do not depend on the branch
			continue
		}
		dropped = append(dropped, s.change)
		pending++
	}
	w.queue = kept
	w.mu.Unlock()
	w.addPending(-pending)
	old := w.remoteTip
	w.plans, w.settled, w.win = nil, nil, nil
	w.store, w.trees = nil, newTreeCache()
	w.remoteTip, w.localTip = plumbing.ZeroHash, plumbing.ZeroHash
	w.remoteGone, w.stale, w.recheck = false, false, false
	w.failures, w.retryAt = 0, time.Time{}
	w.replayUntil, w.replaying = time.Now().Add(w.replayHold), false
	w.setError(fmt.Errorf("push: %w; the branch is started over from the cluster", err))
	w.opts.Metrics.branchStartedOver()
	w.log.Warn("the server no longer holds the deleted branch's history; starting the branch over, every file is written again from the cluster",
		"old_tip", old.String(), "dropped", len(dropped), "err", w.redact(err), "detail", RemoteDetail(err))
	if w.opts.OnReplay != nil {
		w.opts.OnReplay(ReplayRequest{StartedOver: true, Dropped: dropped})
	}
}

// interrupted reports whether a remote operation run with ctx was cut short by the end of Run's
// context (shutdown) rather than failing: its error is then no failure to report. The final push
// attempt runs on its own context; its failures, including its timeout, are real.
func (w *Worker) interrupted(ctx context.Context) bool {
	return !w.final && ctx.Err() != nil
}

// delivered records that the first n plans are on the remote.
func (w *Worker) delivered(n int) {
	done := w.plans[:n]
	w.plans = append([]*plan(nil), w.plans[n:]...)
	if n > 0 {
		w.remoteTip = done[n-1].sha
		w.remoteGone = false
	}
	w.failures, w.retryAt = 0, time.Time{}
	w.branchCheckFailed = false // the push cleared the error a failed check had set
	res := PushResult{Commits: make([]CommitInfo, 0, n)}
	changes := 0
	for _, p := range done {
		res.Commits = append(res.Commits, p.info())
		changes += len(p.changes)
	}
	w.mu.Lock()
	w.status.LastPush = w.opts.Now()
	w.status.LastError = nil
	w.mu.Unlock()
	if len(w.plans) == 0 {
		res.Settled, w.settled = w.settled, nil
	}
	w.addPending(-changes)
	w.log.Info("pushed", "commits", n, "changes", changes, "tip", w.remoteTip.String())
	if w.opts.OnPushed != nil && (n > 0 || len(res.Settled) > 0) {
		w.opts.OnPushed(res)
	}
	w.mu.Lock()
	queued := len(w.queue) > 0
	w.mu.Unlock()
	if queued {
		// Submissions held back while the commits waited for this push: build the next ones.
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// settle records changes the branch already holds. They are reported at once when no commit
// before them is left unpushed; otherwise with the push that delivers those commits, since the
// branch holds them only once that push landed.
func (w *Worker) settle(changes []attribution.AttributedChange) {
	w.settled = append(w.settled, changes...)
	if len(w.plans) > 0 || len(w.settled) == 0 {
		return
	}
	res := PushResult{Settled: w.settled}
	w.settled = nil
	if w.opts.OnPushed != nil {
		w.opts.OnPushed(res)
	}
}

// failed records err and schedules the next attempt with exponential backoff. An operation
// interrupted by shutdown (see interrupted) is only logged: it is neither LastError nor reported
// to OnFailed, and the final push attempt follows.
func (w *Worker) failed(ctx context.Context, what string, err error) {
	if errors.Is(err, errSuperseded) {
		return // the worker gave the branch up (supersede): nothing to retry
	}
	err = w.redact(fmt.Errorf("%s: %w", what, err))
	if w.interrupted(ctx) {
		w.log.Info("git remote operation interrupted by shutdown", "err", err)
		return
	}
	w.failures++
	w.checkFailed, w.branchCheckFailed = false, false // replaced by this failure; a failed check sets its own again
	d := w.backoff(w.failures)
	w.retryAt = time.Now().Add(d)
	w.setError(err)
	w.log.Warn("git remote operation failed; will retry", "err", err, "detail", RemoteDetail(err), "retry_in", d,
		"attempt", w.failures, "pending", w.Status().Pending)
	if w.opts.OnFailed != nil {
		w.opts.OnFailed(err)
	}
}

func (w *Worker) setError(err error) {
	w.mu.Lock()
	w.status.LastError = w.redact(err)
	w.mu.Unlock()
}

func (w *Worker) addPending(n int) {
	if n == 0 {
		return
	}
	w.mu.Lock()
	w.status.Pending += n
	w.mu.Unlock()
	w.opts.Metrics.addPending(n)
}
