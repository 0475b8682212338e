package git

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/notify"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Remote is the repository a GitProvider names and how kubescribe writes to it. Every target
// of one provider shares it.
type Remote struct {
	// Provider identifies the settings; targets of one provider on one branch share a worker.
	Provider    types.NamespacedName
	URL         string
	Credentials Credentials
	Committer   Signature
	// Signer signs every commit of the provider's workers; nil: unsigned.
	Signer            Signer
	CommitWindow      time.Duration
	AuthorEmailDomain string
	// FetchInterval is how often an idle worker fetches its branch (Options.FetchInterval).
	FetchInterval time.Duration
}

// Destination is where one GitTarget's changes go: a branch and a folder of a Remote.
type Destination struct {
	Remote Remote
	Branch string
	// Path is the target's folder; "" is the repository root.
	Path string
	// Stream names this destination as the watch side does (watch.StreamSpec.Destination).
	// A change that carries another destination was observed for a destination the target
	// has left: it is dropped, and a push never advances the resume cursors of a destination
	// other than the one the target is routed to. Empty: changes are not checked.
	Stream string
	// Cluster is the audit route of the source cluster the target mirrors; a change from
	// another cluster is treated like one of another Stream. Empty: not checked.
	Cluster string
}

// TargetStatus is what the router knows of one target's writes.
type TargetStatus struct {
	// Routed is true while the target has a destination.
	Routed bool
	// URL and Branch of the worker the target is routed to.
	URL, Branch string
	// LastCommit is the newest pushed commit that carried the target's changes, and LastPush
	// when that push finished; empty until the first.
	LastCommit string
	LastPush   time.Time
	// LastError is the worker's last remote error (nil after a successful push); Pending the
	// changes it holds that are not on the remote yet. Both are per worker, shared by the
	// targets on its branch.
	LastError error
	Pending   int
	// Unpushed counts the target's changes for its current destination (Destination.Stream)
	// that were handed to its worker and are neither pushed nor settled yet. With nothing in
	// flight before the router either, zero means everything observed for the destination so
	// far is on the remote: a retarget waits for it.
	Unpushed int
	// FolderTree is the hash of the target folder's tree in LastCommit ("" when unknown).
	FolderTree string
	// FolderRefused, when set, says why the target's folder may not become a GitTarget's
	// folder: the worker holds the target's changes, uncommitted, until the folder is fixed.
	FolderRefused *FolderRefusedError
	// StartOvers counts the times the worker of the target's branch started the branch over
	// from nothing since this router started (Worker.startOver): each time, the router had the
	// target's streams hand their whole state over again (RouterOptions.Streams), or the branch
	// would come back without the files of objects that do not change.
	StartOvers int
	// ForeignEdits counts the times the worker found someone else's commits changed the
	// target's folder since this router started (ReplayRequest.Folders): each time, the
	// target's streams handed their state over again, so that the folder is the cluster again.
	ForeignEdits int
	// ReplayedStreams is how many streams the target's last replay (a start-over or a foreign
	// edit) had hand their state over again.
	ReplayedStreams int
}

// FolderRecord is a folder kubescribe pushed: the tree its last push left in it. The
// controller hands the record it kept in a GitTarget's status back with KnowFolder after a
// restart, so a folder still at that tree is not checked again.
type FolderRecord struct {
	Provider types.NamespacedName
	Branch   string
	// Path is the folder ("" for the repository root).
	Path string
	// Tree is the folder's tree hash.
	Tree string
}

// cursorAdvancer records pushed changes as the streams' resume points; watch.CursorStore
// implements it.
type cursorAdvancer interface {
	Advance(ctx context.Context, changes []watch.Change) error
}

// streamReplayer has a target's streams hand their state over again; watch.Registry implements it.
type streamReplayer interface {
	Replay(cluster string, target types.NamespacedName) int
}

// cursorTimeout bounds one cursor advance.
const cursorTimeout = 5 * time.Second

// RouterOptions configures a Router.
type RouterOptions struct {
	// Streams, when set, is asked to have a target's streams hand their state over again when
	// its branch no longer holds what was pushed (a worker started it over, or found someone
	// else's commits in the target's folder).
	Streams streamReplayer
	// Cursors, when set, is told of every change a push delivered, so a restart resumes
	// after it. A failed advance is logged; the next start replays those changes, which the
	// writer recognises as already on the branch.
	Cursors cursorAdvancer
	// Closes, when set, keeps every close request a worker accepted until the controller
	// forgets it, so that a restart commits a closed window again and reports a commit the
	// stopping process pushed. Nil keeps them in memory only.
	Closes *CloseStore
	// Epochs, when set, gives every branch worker a writer epoch (writer.go): with several
	// replicas, a worker that a newer one took the branch from gives it up. WriterEpochs
	// implements it.
	Epochs EpochSource
	// Pushes, when set, keeps each worker's last push record (pushdelivery.go), so that a
	// writer lost between a push and its cursors' advance has its heir commit none of that
	// push's changes again. Used with Epochs (the record is a writer slot's).
	Pushes *Deliveries
	// SupersededHold is how long a branch whose worker a newer writer superseded is refused
	// (Route answers ErrSuperseded), unless the ownership view changes first: long enough for
	// two replicas' views to agree again (the lease duration), short enough that a branch both
	// gave up (the newer writer's replica released it meanwhile) is taken up again. Default 15s.
	SupersededHold time.Duration
	// Metrics may be nil.
	Metrics *Metrics
	// Logger is the base logger; workers add component, url and branch.
	Logger *slog.Logger
	// newWorker builds a worker; test seam, defaults to NewWorker.
	newWorker func(Options) (*Worker, error)
}

// EpochSource hands out writer epochs: each higher than every one handed out before for the
// branch, whichever process asks, and than every one Reached was told of.
type EpochSource interface {
	Next(ctx context.Context, provider types.NamespacedName, branch string) (int64, error)
	// Reached records an epoch found on the branch.
	Reached(ctx context.Context, provider types.NamespacedName, branch string, epoch int64) error
	// Issued tells whether an epoch a commit claims may have been handed out.
	Issued(ctx context.Context, provider types.NamespacedName, branch string, epoch int64) (bool, error)
}

// workerKey names the single writer of one branch of one provider's repository.
type workerKey struct {
	provider types.NamespacedName
	branch   string
}

type runningWorker struct {
	key    workerKey
	worker *Worker
	cancel context.CancelFunc
}

type route struct {
	worker  *runningWorker
	path    string
	stream  string
	cluster string
}

// id names the destination for the per-destination counts.
func (rt route) id() string { return rt.cluster + " " + rt.stream }

// foreign reports whether c was observed for another destination than rt's: another stream
// or another source cluster.
func (rt route) foreign(c watch.Change) bool {
	return (rt.stream != "" && c.Destination != "" && c.Destination != rt.stream) ||
		(rt.cluster != "" && c.Cluster != "" && c.Cluster != rt.cluster)
}

// streamCount is what the router counted of one target's changes for its current destination
// (stream holds route.id()).
type streamCount struct {
	stream          string
	submitted, done int
}

// pushRecord is what the router knows of one target's last push: its commit and when it
// landed (empty when the record only holds a folder handed over by KnowFolder), and the folder
// it left.
type pushRecord struct {
	sha    string
	time   time.Time
	folder FolderRecord
}

// Router owns the git side of the data path: which branch worker writes each GitTarget's
// changes, the workers' lifecycle, and what their pushes reported. Deliver is the data path;
// Route and Unroute are how the controller declares where targets go, TargetStatus and Updates
// how it reads back what happened. Nothing in the router calls into the controller.
type Router struct {
	opts RouterOptions
	log  *slog.Logger

	mu      sync.RWMutex
	ctx     context.Context // workers run under it; nil before Start
	stopAll context.CancelFunc
	group   sync.WaitGroup
	routes  map[types.NamespacedName]route
	workers map[workerKey]*runningWorker
	// pushes are the targets' last pushes, or the folders their statuses recorded.
	pushes map[types.NamespacedName]pushRecord
	// counts holds, per target, the changes submitted and done for its current destination;
	// guarded by countMu, which is taken after mu when both are held.
	countMu sync.Mutex
	counts  map[types.NamespacedName]streamCount
	// closes are the close requests handed to workers, by ID, until ForgetClose.
	closes map[string]*closeState
	// startOvers and foreignEdits count, by target, the start-overs of the branches it was
	// routed to and the foreign edits of its folder (TargetStatus.StartOvers, ForeignEdits).
	startOvers, foreignEdits map[types.NamespacedName]int
	// replayedStreams is, by target, how many streams its last replay concerned.
	replayedStreams map[types.NamespacedName]int
	// released are the targets another replica writes (Release, or a superseded worker):
	// their changes are dropped quietly. superseded are the branches whose worker a newer
	// writer took over, with when, until ClearSuperseded or SupersededHold later.
	released   map[types.NamespacedName]struct{}
	superseded map[workerKey]time.Time
	// lastSuperseded is, by branch, when its worker here was last superseded (LastSuperseded);
	// never cleared.
	lastSuperseded map[workerKey]time.Time

	// updated holds the targets whose status changed since the controller last took them.
	updated *notify.Set[types.NamespacedName]
}

// NewRouter returns a Router; workers start once Start was called.
func NewRouter(opts RouterOptions) *Router {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.newWorker == nil {
		opts.newWorker = NewWorker
	}
	return &Router{
		opts:    opts,
		log:     opts.Logger.With("component", "git"),
		routes:  map[types.NamespacedName]route{},
		workers: map[workerKey]*runningWorker{},
		pushes:  map[types.NamespacedName]pushRecord{},
		counts:  map[types.NamespacedName]streamCount{},
		closes:  map[string]*closeState{},
		updated: notify.NewSet[types.NamespacedName](),

		startOvers:      map[types.NamespacedName]int{},
		foreignEdits:    map[types.NamespacedName]int{},
		replayedStreams: map[types.NamespacedName]int{},
		released:        map[types.NamespacedName]struct{}{},
		superseded:      map[workerKey]time.Time{},
		lastSuperseded:  map[workerKey]time.Time{},
	}
}

// Start lets the router run workers under ctx. Workers outlive the caller's cancellation only
// until Stop: ctx should not be the one whose end starts a shutdown.
func (r *Router) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctx, r.stopAll = context.WithCancel(ctx)
}

// Stop tells every worker to commit what it holds and make a last push, and waits for them
// until ctx ends.
func (r *Router) Stop(ctx context.Context) error {
	r.mu.Lock()
	stop := r.stopAll
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
	done := make(chan struct{})
	go func() { r.group.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("git workers did not finish: %w", ctx.Err())
	}
}

// Route sends target's changes to dest, starting its branch worker when none runs, and
// replacing one that runs with other settings. Rotated credentials and a new fetch interval are
// taken in place, so the worker keeps what it holds.
func (r *Router) Route(target types.NamespacedName, dest Destination) error {
	id := route{stream: dest.Stream, cluster: dest.Cluster}.id()
	r.mu.RLock()
	old, routed := r.routes[target]
	r.mu.RUnlock()
	var kept []closeRecord
	if r.opts.Closes != nil && (!routed || old.id() != id) {
		// Closes an earlier process accepted for this target: read before the route exists,
		// so that they are handed to the worker before any change of the target.
		ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
		var err error
		kept, err = r.opts.Closes.all(ctx, target, time.Now())
		cancel()
		if err != nil {
			r.log.Warn("cannot read the commit requests closed before a restart; they end as lost", "target", target.String(), "err", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := workerKey{provider: dest.Remote.Provider, branch: dest.Branch}
	if r.supersededLocked(key) {
		r.setRouteLocked(target, nil)
		r.released[target] = struct{}{}
		return ErrSuperseded
	}
	delete(r.released, target)
	w, err := r.ensureWorkerLocked(key, dest.Remote)
	if err != nil {
		r.setRouteLocked(target, nil)
		return err
	}
	rt := route{worker: w, path: dest.Path, stream: dest.Stream, cluster: dest.Cluster}
	r.setRouteLocked(target, &rt)
	r.resumeClosesLocked(target, rt, kept)
	return nil
}

// resumeClosesLocked takes over the closes an earlier process accepted for target: a request
// whose commit was pushed is reported as committed; one whose window is not pushed yet has its
// changes and then its close handed to the worker again, so the commit is made with its message.
// A close of another destination (the target moved since) is forgotten: it ends as lost. r.mu
// must be held.
func (r *Router) resumeClosesLocked(target types.NamespacedName, rt route, kept []closeRecord) {
	for i := range kept {
		rec := &kept[i]
		id := rec.Request.ID
		if _, known := r.closes[id]; known {
			continue
		}
		if rec.Route != rt.id() {
			go r.forgetStored(target, id)
			continue
		}
		cs := &closeState{target: target, branch: rt.worker.key.branch, worker: rt.worker.worker}
		r.closes[id] = cs
		if rec.SHA != "" {
			cs.result = CloseResult{Outcome: CloseCommitted, SHA: rec.SHA, Branch: rec.Branch}
			continue
		}
		changes := rec.changes(target)
		r.countMu.Lock()
		n := r.counts[target]
		if n.stream != rt.id() {
			n = streamCount{stream: rt.id()}
		}
		n.submitted += len(changes)
		r.counts[target] = n
		r.countMu.Unlock()
		for _, c := range changes {
			rt.worker.worker.Submit(rt.path, c)
		}
		if !rt.worker.worker.RequestClose(rec.request(target)) {
			cs.result.Outcome = CloseLost
		}
		r.log.Info("commit request closed before a restart: its window is committed again",
			"target", target.String(), "request", rec.Request.Request, "changes", len(changes))
	}
}

// closeAccepted keeps a close request a worker accepted, with its window's changes.
func (r *Router) closeAccepted(req CloseRequest, changes []attribution.AttributedChange) {
	if r.opts.Closes == nil {
		return
	}
	r.mu.RLock()
	rt, ok := r.routes[req.Target]
	r.mu.RUnlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
	defer cancel()
	if err := r.opts.Closes.put(ctx, req.Target, newCloseRecord(req, rt.id(), changes, time.Now())); err != nil {
		r.log.Warn("cannot keep a commit request's close in Redis; if kubescribe stops before the push, the request ends as lost",
			"target", req.Target.String(), "request", req.Request, "err", err)
	}
}

// forgetStored removes the kept close id of target.
func (r *Router) forgetStored(target types.NamespacedName, id string) {
	if r.opts.Closes == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
	defer cancel()
	if err := r.opts.Closes.forget(ctx, target, id); err != nil {
		r.log.Debug("cannot remove a kept commit request close; it expires", "target", target.String(), "err", err)
	}
}

// Unroute stops writing target's changes; a worker no target uses any more commits what it
// holds, pushes and stops. forget also drops what the router recorded of the target's pushes
// (a deleted target; one re-created with its name starts afresh).
func (r *Router) Unroute(target types.NamespacedName, forget bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setRouteLocked(target, nil)
	delete(r.released, target)
	if forget {
		delete(r.pushes, target)
		delete(r.startOvers, target)
		delete(r.foreignEdits, target)
		delete(r.replayedStreams, target)
	}
}

// Release stops writing target's changes because another replica writes its branch: as
// Unroute, but the changes still observed for it (a handover under way) are dropped quietly,
// not reported as unrouted. What the router recorded of its pushes is kept.
func (r *Router) Release(target types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setRouteLocked(target, nil)
	r.released[target] = struct{}{}
}

// Superseded reports whether the worker of provider's branch was superseded by a newer writer
// (another replica) less than SupersededHold ago and since the last ClearSuperseded; until
// then Route refuses the branch.
func (r *Router) Superseded(provider types.NamespacedName, branch string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.supersededLocked(workerKey{provider: provider, branch: branch})
}

// LastSuperseded is when the worker of provider's branch here was last superseded by a newer
// writer (zero for never), whatever ClearSuperseded forgot since: the changes that worker held
// were dropped, and the writer in between may have dropped some too.
func (r *Router) LastSuperseded(provider types.NamespacedName, branch string) time.Time {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.lastSuperseded[workerKey{provider: provider, branch: branch}]
}

// SupersededHold is RouterOptions.SupersededHold, or its default.
func (r *Router) SupersededHold() time.Duration {
	if r.opts.SupersededHold > 0 {
		return r.opts.SupersededHold
	}
	return defaultSupersededHold
}

// defaultSupersededHold is the default lease duration (internal/ownership).
const defaultSupersededHold = 15 * time.Second

// supersededLocked is Superseded for k; r.mu must be held.
func (r *Router) supersededLocked(k workerKey) bool {
	at, lost := r.superseded[k]
	return lost && time.Since(at) < r.SupersededHold()
}

// ClearSuperseded forgets which branches were taken over by a newer writer: the ownership view
// changed, so Route may start their workers again (with a newer epoch).
func (r *Router) ClearSuperseded() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.superseded)
}

// onSuperseded records that worker rw gave its branch up to the writer of epoch newer: its
// targets are released and Route refuses the branch until ClearSuperseded.
func (r *Router) onSuperseded(rw *runningWorker, newer int64) {
	r.mu.Lock()
	var targets []types.NamespacedName
	// Whether it still writes the branch or was stopping (released, its successor here already
	// started), what it held unpushed is dropped: the controller learns it (LastSuperseded) when
	// it syncs the branch's targets next.
	r.lastSuperseded[rw.key] = time.Now()
	stopping := r.workers[rw.key] != rw
	if stopping {
		for name, rt := range r.routes {
			if rt.worker != nil && rt.worker.key == rw.key {
				targets = append(targets, name)
			}
		}
	} else {
		r.superseded[rw.key] = time.Now()
		for name, rt := range r.routes {
			if rt.worker == rw {
				targets = append(targets, name)
			}
		}
		for _, name := range targets {
			r.setRouteLocked(name, nil)
			r.released[name] = struct{}{}
		}
		if r.workers[rw.key] == rw { // setRouteLocked stops it once unused
			r.stopWorkerLocked(rw)
		}
	}
	r.mu.Unlock()
	r.reached(rw.key, newer)
	if stopping {
		r.log.Warn("a stopping writer of this branch found a newer one there; what it held unpushed is dropped and handed over again",
			"provider", rw.key.provider.String(), "branch", rw.key.branch, "newer_writer", newer)
	} else {
		r.log.Warn("another replica took this branch over; its GitTargets are released here",
			"provider", rw.key.provider.String(), "branch", rw.key.branch, "newer_writer", newer, "targets", len(targets))
	}
	r.notify(targets...)
}

// KnowFolder records what target's last push left in its folder, as kept by the caller (the
// GitTarget's status), unless the router knows a push of its own already.
func (r *Router) KnowFolder(target types.NamespacedName, rec FolderRecord) {
	if rec.Tree == "" {
		return
	}
	rec.Path = folderKey(rec.Path)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pushes[target]; !ok {
		r.pushes[target] = pushRecord{folder: rec}
	}
}

// knownFolder reports whether the last push of a target into folder of worker k's branch left
// tree there.
func (r *Router) knownFolder(k workerKey, folder string, tree plumbing.Hash) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, p := range r.pushes {
		if rec := p.folder; rec.Provider == k.provider && rec.Branch == k.branch && rec.Path == folder && rec.Tree == tree.String() {
			return true
		}
	}
	return false
}

// Routed reports whether target has a destination.
func (r *Router) Routed(target types.NamespacedName) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.routes[target]
	return ok
}

// TargetStatus reports what the router knows of target's writes.
func (r *Router) TargetStatus(target types.NamespacedName) TargetStatus {
	r.mu.RLock()
	rt, routed := r.routes[target]
	push := r.pushes[target]
	startOvers, foreignEdits, replayed := r.startOvers[target], r.foreignEdits[target], r.replayedStreams[target]
	r.mu.RUnlock()
	var st TargetStatus
	if push.sha != "" {
		st.LastCommit, st.LastPush, st.FolderTree = push.sha, push.time, push.folder.Tree
	}
	st.StartOvers, st.ForeignEdits, st.ReplayedStreams = startOvers, foreignEdits, replayed
	if routed {
		ws := rt.worker.worker.Status()
		st.Routed, st.URL, st.Branch = true, rt.worker.worker.Remote().URL, rt.worker.key.branch
		st.LastError, st.Pending = ws.LastError, ws.Pending
		r.countMu.Lock()
		if c := r.counts[target]; c.stream == rt.id() {
			st.Unpushed = max(0, c.submitted-c.done)
		}
		r.countMu.Unlock()
		st.FolderRefused = rt.worker.worker.FolderRefusal(rt.path)
	}
	return st
}

// Updates signals that the status of some targets changed (a push landed or failed); Changed
// then says which. Updates is never closed.
func (r *Router) Updates() <-chan struct{} { return r.updated.C() }

// Changed returns, and forgets, the targets whose status changed since the last call.
func (r *Router) Changed() []types.NamespacedName { return r.updated.Take() }

func (r *Router) notify(targets ...types.NamespacedName) { r.updated.Mark(targets...) }

// Deliver hands an attributed change to its target's worker. The read lock is held across
// Submit (which never blocks): a worker is replaced or stopped only under the write lock, so a
// change is handed either to the old worker before it is told to stop, and is part of what it
// commits and pushes on its way out, or to its successor.
func (r *Router) Deliver(ac attribution.AttributedChange) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rt, ok := r.routes[ac.Target]
	if _, released := r.released[ac.Target]; !ok && released {
		r.opts.Metrics.changeReleased()
		r.log.Debug("change dropped: another replica writes its GitTarget's branch", "target", ac.Target.String(),
			"resource", ac.GVR.Resource, "namespace", ac.Namespace, "name", ac.Name, "op", ac.Op)
		return
	}
	if !ok {
		r.opts.Metrics.changeUnrouted()
		r.log.Warn("change dropped: its GitTarget is not Ready", "target", ac.Target.String(),
			"resource", ac.GVR.Resource, "namespace", ac.Namespace, "name", ac.Name, "op", ac.Op)
		return
	}
	if rt.foreign(ac.Change) {
		r.opts.Metrics.changeUnrouted()
		r.log.Info("change dropped: it was observed for a destination its GitTarget has left", "target", ac.Target.String(),
			"cluster", ac.Cluster, "destination", ac.Destination, "routed", rt.id(), "resource", ac.GVR.Resource, "namespace", ac.Namespace, "name", ac.Name, "op", ac.Op)
		return
	}
	r.countMu.Lock()
	c := r.counts[ac.Target]
	if c.stream != rt.id() {
		c = streamCount{stream: rt.id()}
	}
	c.submitted++
	r.counts[ac.Target] = c
	r.countMu.Unlock()
	rt.worker.worker.Submit(rt.path, ac)
}

// ensureWorkerLocked returns the running worker for k, replacing one started with other
// settings. r.mu must be held.
func (r *Router) ensureWorkerLocked(k workerKey, remote Remote) (*runningWorker, error) {
	old, replacing := r.workers[k]
	if replacing {
		adopted, err := old.worker.Adopt(remote)
		if err != nil {
			return nil, err
		}
		if adopted {
			return old, nil
		}
		r.stopWorkerLocked(old)
	}
	if r.ctx == nil {
		return nil, errors.New("the git router is not running")
	}
	rw := &runningWorker{key: k}
	w, err := r.opts.newWorker(Options{
		URL:               remote.URL,
		Branch:            k.branch,
		Credentials:       remote.Credentials,
		Committer:         remote.Committer,
		Signer:            remote.Signer,
		CommitWindow:      remote.CommitWindow,
		AuthorEmailDomain: remote.AuthorEmailDomain,
		FetchInterval:     remote.FetchInterval,
		Logger:            r.opts.Logger.With("provider", k.provider.String()),
		Metrics:           r.opts.Metrics,
		OnPushed:          func(res PushResult) { r.onPushed(k, res) },
		OnFailed:          func(error) { r.notify(r.targetsOf(k)...) },
		KnownFolder:       func(folder string, tree plumbing.Hash) bool { return r.knownFolder(k, folder, tree) },
		OnFolder:          func(folder string) { r.notify(r.targetsIn(k, folder)...) },
		OnClosed:          r.onClosed,
		OnCloseAccepted:   r.closeAccepted,
		OnReplay:          func(req ReplayRequest) { r.onReplay(k, req) },
		WriterEpoch:       r.writerEpoch(k),
		EpochIssued:       r.epochIssued(k),
		WriterSlot:        k.provider.String(),
		Pushes:            r.opts.Pushes,
		OnSuperseded:      func(newer int64) { r.onSuperseded(rw, newer) },
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(r.ctx)
	rw.worker, rw.cancel = w, cancel
	r.workers[k] = rw
	r.group.Add(1)
	go func() {
		defer r.group.Done()
		if err := w.Run(ctx); err != nil {
			r.log.Error("git worker stopped", "provider", k.provider.String(), "branch", k.branch, "err", err)
		}
		if !w.Superseded() {
			r.closesLost(w) // a superseded worker's closes are the newer writer's (CloseStore)
		}
	}()
	if replacing {
		// Other targets on this branch switch to the new worker at once, so no change is
		// handed to the stopping one.
		for name, rt := range r.routes {
			if rt.worker == old {
				rt.worker = rw
				r.routes[name] = rt
				rw.worker.PrepareFolder(rt.path)
			}
		}
	}
	r.log.Info("started git worker", "provider", k.provider.String(), "branch", k.branch, "url", remote.URL)
	return rw, nil
}

// writerEpoch hands the workers of k their writer epochs, when the router has Epochs.
func (r *Router) writerEpoch(k workerKey) func(context.Context) (int64, error) {
	if r.opts.Epochs == nil {
		return nil
	}
	return func(ctx context.Context) (int64, error) { return r.opts.Epochs.Next(ctx, k.provider, k.branch) }
}

// epochIssued checks the epochs the workers of k find on the branch, when the router has Epochs.
func (r *Router) epochIssued(k workerKey) func(context.Context, int64) (bool, error) {
	if r.opts.Epochs == nil {
		return nil
	}
	return func(ctx context.Context, epoch int64) (bool, error) {
		return r.opts.Epochs.Issued(ctx, k.provider, k.branch, epoch)
	}
}

// reached raises the branch's epoch counter to epoch, found on the branch: a counter Redis lost
// would hand the next worker an epoch the branch already holds a newer one than.
func (r *Router) reached(k workerKey, epoch int64) {
	if r.opts.Epochs == nil || epoch <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.opts.Epochs.Reached(ctx, k.provider, k.branch, epoch); err != nil {
		r.log.Warn("cannot record the writer epoch found on the branch; the next writer may be superseded again",
			"provider", k.provider.String(), "branch", k.branch, "epoch", epoch, "err", err)
	}
}

// stopWorkerLocked asks a worker to commit and push what it holds, then stop.
func (r *Router) stopWorkerLocked(rw *runningWorker) {
	rw.cancel()
	delete(r.workers, rw.key)
	r.log.Info("stopping git worker", "provider", rw.key.provider.String(), "branch", rw.key.branch)
}

// setRouteLocked records (or with nil removes) a target's route and stops workers no route
// uses. r.mu must be held.
func (r *Router) setRouteLocked(target types.NamespacedName, rt *route) {
	if old, ok := r.routes[target]; ok && (rt == nil || old.id() != rt.id()) {
		r.countMu.Lock()
		delete(r.counts, target) // a new destination counts afresh
		r.countMu.Unlock()
	}
	if old, ok := r.routes[target]; ok && (rt == nil || rt.worker != old.worker || folderKey(rt.path) != folderKey(old.path)) {
		defer r.leftFolderLocked(old)
	}
	if rt == nil {
		delete(r.routes, target)
	} else {
		if old, ok := r.routes[target]; !ok || old.worker != rt.worker || folderKey(old.path) != folderKey(rt.path) {
			rt.worker.worker.PrepareFolder(rt.path)
		}
		r.routes[target] = *rt
	}
	used := map[*runningWorker]bool{}
	for _, rt := range r.routes {
		used[rt.worker] = true
	}
	for _, rw := range r.workers {
		if !used[rw] {
			r.stopWorkerLocked(rw)
		}
	}
}

// leftFolderLocked tells a worker that a route left its folder, unless another route of the
// worker writes there. r.mu must be held.
func (r *Router) leftFolderLocked(old route) {
	for _, rt := range r.routes {
		if rt.worker == old.worker && folderKey(rt.path) == folderKey(old.path) {
			return
		}
	}
	old.worker.worker.ForgetFolder(old.path)
}

// onPushed advances the resume cursors past the changes a push delivered, and records the last
// commit of each target it carried and the folder it left. Only the changes of a target's current destination count:
// the cursors of a destination it left (a retarget dropped them) are not written again, and
// neither are those of a target that has no route (a deleted one).
func (r *Router) onPushed(k workerKey, res PushResult) {
	var all []watch.Change
	for _, ci := range res.Commits {
		for _, c := range ci.Changes {
			all = append(all, c.Change)
		}
	}
	for _, c := range res.Settled {
		all = append(all, c.Change)
	}
	changes := make([]watch.Change, 0, len(all))
	counted := map[types.NamespacedName]bool{}
	r.mu.RLock()
	r.countMu.Lock()
	for _, c := range all {
		rt, ok := r.routes[c.Target]
		if !ok || rt.foreign(c) {
			continue
		}
		// A sweep names no object of a cursor; the cursor holds an unchanged object's version
		// already (that is what made it unchanged), whether its file was there or written again.
		if c.Op != watch.OpSweep && !c.Unchanged {
			changes = append(changes, c)
		}
		if r.countDoneLocked(c, rt) {
			counted[c.Target] = true
		}
	}
	r.countMu.Unlock()
	r.mu.RUnlock()
	if r.opts.Cursors != nil && len(changes) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), cursorTimeout)
		if err := r.opts.Cursors.Advance(ctx, changes); err != nil {
			r.log.Warn("cannot advance the resume cursors; a restart replays these changes", "changes", len(changes), "err", err)
		}
		cancel()
	}
	now := time.Now()
	targets := make([]types.NamespacedName, 0, len(res.Commits)+len(counted))
	for t := range counted {
		targets = append(targets, t) // a settled change may be what a retarget waits for
	}
	var pushedCloses []CommitInfo
	r.mu.Lock()
	for _, ci := range res.Commits {
		r.pushes[ci.Target] = pushRecord{sha: ci.SHA, time: now,
			folder: FolderRecord{Provider: k.provider, Branch: k.branch, Path: ci.Path, Tree: ci.FolderTree}}
		targets = append(targets, ci.Target)
		if cs, ok := r.closes[ci.Request]; ok && ci.Request != "" {
			cs.result = CloseResult{Outcome: CloseCommitted, SHA: ci.SHA, Branch: cs.branch}
			pushedCloses = append(pushedCloses, ci)
		}
	}
	r.mu.Unlock()
	if r.opts.Closes != nil {
		for _, ci := range pushedCloses {
			ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
			if err := r.opts.Closes.pushed(ctx, ci.Target, ci.Request, ci.SHA, k.branch); err != nil {
				r.log.Warn("cannot record a commit request's pushed commit in Redis; a restart reports it as lost",
					"target", ci.Target.String(), "err", err)
			}
			cancel()
		}
	}
	r.notify(targets...)
}

// countDoneLocked counts c, a change of the target rt routes, as done for the target's current
// destination, and reports whether it did. A deletion a sweep implied is not counted: the sweep
// itself is. r.countMu must be held.
func (r *Router) countDoneLocked(c watch.Change, rt route) bool {
	if c.Op == watch.OpDelete && c.UID == "" {
		return false
	}
	n, ok := r.counts[c.Target]
	if !ok || n.stream != rt.id() {
		return false
	}
	n.done++
	r.counts[c.Target] = n
	return true
}

// onReplay has the streams of the targets concerned hand their state over again (their
// worker's branch no longer holds what it pushed), then records it for their status and signals
// them. A start-over concerns every target on the branch; the changes it dropped count as done
// for their targets (their streams hand them over again, and they are counted then). Foreign
// edits concern the targets writing into the folders named. It runs in the worker's goroutine:
// the state handed over reaches the worker after what it was told before.
func (r *Router) onReplay(k workerKey, req ReplayRequest) {
	r.mu.Lock()
	r.countMu.Lock()
	for _, c := range req.Dropped {
		if rt, ok := r.routes[c.Target]; ok && !rt.foreign(c.Change) {
			r.countDoneLocked(c.Change, rt)
		}
	}
	r.countMu.Unlock()
	in := func(f string) bool { return slices.Contains(req.Folders, f) }
	if req.StartedOver {
		in = nil // every folder of the branch
	}
	targets := r.targetsLocked(k, in)
	clusters := make([]string, len(targets))
	for i, name := range targets {
		clusters[i] = r.routes[name].cluster
	}
	r.mu.Unlock()
	replayed := make([]int, len(targets))
	if r.opts.Streams != nil {
		for i, name := range targets {
			replayed[i] = r.opts.Streams.Replay(clusters[i], name)
		}
	}
	r.mu.Lock()
	counts := r.foreignEdits
	if req.StartedOver {
		counts = r.startOvers
	}
	for i, name := range targets {
		counts[name]++
		r.replayedStreams[name] = replayed[i]
	}
	r.mu.Unlock()
	if req.StartedOver {
		r.log.Warn("branch started over; its GitTargets' streams hand their state over again",
			"provider", k.provider.String(), "branch", k.branch, "targets", len(targets), "dropped", len(req.Dropped))
	}
	r.notify(targets...)
}

// targetsOf lists the targets a worker writes for.
func (r *Router) targetsOf(k workerKey) []types.NamespacedName {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.targetsLocked(k, nil)
}

// targetsIn lists the targets a worker writes for into folder.
func (r *Router) targetsIn(k workerKey, folder string) []types.NamespacedName {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.targetsLocked(k, func(f string) bool { return f == folder })
}

// targetsLocked lists the targets worker k writes for, into a folder (folderKey) that in
// accepts when in is not nil. r.mu must be held.
func (r *Router) targetsLocked(k workerKey, in func(folder string) bool) []types.NamespacedName {
	var names []types.NamespacedName
	for name, rt := range r.routes {
		if rt.worker.key == k && (in == nil || in(folderKey(rt.path))) {
			names = append(names, name)
		}
	}
	return names
}

// RouteInfo describes a target's route, for status and tests.
type RouteInfo struct {
	Remote Remote
	Branch string
	Path   string
	// Stream is the destination's name on the watch side (Destination.Stream), and Cluster
	// its source cluster (Destination.Cluster).
	Stream, Cluster string
	// Worker is the branch worker the target's changes go to.
	Worker *Worker
}

// RouteOf reports target's route.
func (r *Router) RouteOf(target types.NamespacedName) (RouteInfo, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rt, ok := r.routes[target]
	if !ok {
		return RouteInfo{}, false
	}
	remote := rt.worker.worker.Remote()
	remote.Provider = rt.worker.key.provider
	return RouteInfo{Remote: remote, Branch: rt.worker.key.branch, Path: rt.path, Stream: rt.stream, Cluster: rt.cluster, Worker: rt.worker.worker}, true
}

// WorkerCount is the number of running branch workers.
func (r *Router) WorkerCount() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.workers)
}

// closeState is a close request the router handed to a worker.
type closeState struct {
	target types.NamespacedName
	branch string
	worker *Worker
	result CloseResult
}

// RequestClose hands req to the worker of its target, once per ID: a request already handed
// over is not sent again (the controller re-reconciles freely). It fails when the target has
// no route.
func (r *Router) RequestClose(req CloseRequest) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, known := r.closes[req.ID]; known {
		return nil
	}
	rt, ok := r.routes[req.Target]
	if !ok {
		return fmt.Errorf("GitTarget %s is not routed to a branch", req.Target)
	}
	cs := &closeState{target: req.Target, branch: rt.worker.key.branch, worker: rt.worker.worker}
	r.closes[req.ID] = cs
	if !rt.worker.worker.RequestClose(req) {
		cs.result.Outcome = CloseLost
	}
	return nil
}

// CloseResult reports what became of the close request id of target; false when neither this
// router nor, with a CloseStore, an earlier process received it (or it was forgotten). A close
// an earlier process accepted and did not push is pending until the target is routed again.
func (r *Router) CloseResult(target types.NamespacedName, id string) (CloseResult, bool) {
	r.mu.RLock()
	cs, ok := r.closes[id]
	r.mu.RUnlock()
	if ok {
		return cs.result, true
	}
	if r.opts.Closes == nil {
		return CloseResult{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
	defer cancel()
	rec, found, err := r.opts.Closes.get(ctx, target, id)
	switch {
	case err != nil:
		r.log.Warn("cannot read a commit request's close; asking again later", "target", target.String(), "err", err)
		return CloseResult{Outcome: CloseUnknown}, true
	case !found:
		return CloseResult{}, false
	case rec.SHA != "":
		return CloseResult{Outcome: CloseCommitted, SHA: rec.SHA, Branch: rec.Branch}, true
	}
	return CloseResult{Outcome: ClosePending}, true
}

// ForgetClose drops what the router, and its CloseStore, hold of the close request id of
// target.
func (r *Router) ForgetClose(target types.NamespacedName, id string) {
	r.mu.Lock()
	delete(r.closes, id)
	r.mu.Unlock()
	r.forgetStored(target, id)
}

// onClosed records a close request that ended without a commit, and signals its target.
func (r *Router) onClosed(id string, o CloseOutcome) {
	r.mu.Lock()
	cs, ok := r.closes[id]
	if ok && cs.result.Outcome == ClosePending {
		cs.result = CloseResult{Outcome: o}
	}
	r.mu.Unlock()
	if ok {
		r.notify(cs.target)
	}
}

// closesLost marks the requests a stopped worker never reported as lost.
func (r *Router) closesLost(w *Worker) {
	var targets []types.NamespacedName
	r.mu.Lock()
	for _, cs := range r.closes {
		if cs.worker == w && cs.result.Outcome == ClosePending {
			cs.result = CloseResult{Outcome: CloseLost}
			targets = append(targets, cs.target)
		}
	}
	r.mu.Unlock()
	r.notify(targets...)
}
