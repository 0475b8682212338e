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

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
)

// PushResult describes one successful push.
type PushResult struct {
	// Commits delivered by this push, oldest first.
	Commits []CommitInfo
}

// CommitInfo is one commit and the changes it holds.
type CommitInfo struct {
	SHA     string
	Target  types.NamespacedName
	Changes []attribution.AttributedChange
}

// Status is a snapshot of a worker's state.
type Status struct {
	// LastCommit is the SHA of the newest local commit (pushed or not); "" before the first.
	LastCommit string
	// LastPush is when the last successful push finished (Options.Now clock).
	LastPush time.Time
	// LastError is the last clone, fetch, commit or push error; nil after a successful push.
	// It never contains the credentials.
	LastError error
	// Pending counts submitted changes that are not on the remote yet.
	Pending int
}

const (
	remoteName = gogit.DefaultRemoteName
	// maxRebaseRounds bounds how often one push cycle rebuilds on a moving remote before it
	// backs off.
	maxRebaseRounds = 3
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
	deadline time.Time // real clock
	changes  []attribution.AttributedChange
}

// Worker is the single writer of one branch of one remote repository. It gathers submitted
// changes into commits, builds them in an in-memory repository and pushes them. Submit and
// Status may be called from any goroutine; Run runs the worker.
type Worker struct {
	opts      Options
	log       *slog.Logger
	branch    plumbing.ReferenceName // refs/heads/<branch>
	remoteRef plumbing.ReferenceName // refs/remotes/origin/<branch>
	auth      transport.AuthMethod

	// Test seams.
	backoff      func(attempt int) time.Duration
	opTimeout    time.Duration
	finalTimeout time.Duration

	running atomic.Bool
	wake    chan struct{}

	mu     sync.Mutex
	queue  []submission
	status Status

	// Owned by the Run goroutine.
	repo      *gogit.Repository // nil until the first clone succeeded
	remoteTip plumbing.Hash     // remote branch as last seen; parent of the first unpushed commit
	localTip  plumbing.Hash     // newest local commit
	stale     bool              // plans must be rebuilt on remoteTip before pushing
	win       *window
	plans     []*plan // closed windows not yet pushed, oldest first
	failures  int
	retryAt   time.Time // real clock; zero = now
}

// NewWorker validates opts and returns a worker; nothing touches the remote before Run.
func NewWorker(opts Options) (*Worker, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	w := &Worker{
		opts:         opts,
		branch:       plumbing.NewBranchReferenceName(opts.Branch),
		remoteRef:    plumbing.NewRemoteReferenceName(remoteName, opts.Branch),
		backoff:      defaultBackoff,
		opTimeout:    defaultOpTimeout,
		finalTimeout: defaultFinalTimeout,
		wake:         make(chan struct{}, 1),
	}
	w.log = opts.Logger.With("component", "git", "url", opts.URL, "branch", opts.Branch)
	if isHTTP(opts.URL) && !opts.Credentials.empty() {
		w.auth = opts.Credentials.basicAuth()
		if strings.HasPrefix(strings.ToLower(opts.URL), "http://") {
			w.log.Warn("credentials are sent over plain http; use https")
		}
	}
	return w, nil
}

// Submit queues a change for the GitTarget folder targetPath. It never blocks and never drops:
// the queue is unbounded.
func (w *Worker) Submit(targetPath string, c attribution.AttributedChange) {
	w.mu.Lock()
	w.queue = append(w.queue, submission{targetPath: targetPath, change: c})
	w.status.Pending++
	w.mu.Unlock()
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
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		w.drain()
		if w.win != nil && !time.Now().Before(w.win.deadline) {
			w.closeWindow()
		}
		w.sync(ctx)
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
	needRemote := w.repo == nil || w.stale || len(w.plans) > 0
	if needRemote && w.retryAt.After(time.Now()) && (next.IsZero() || w.retryAt.Before(next)) {
		next = w.retryAt
	}
	return next, !next.IsZero()
}

func (w *Worker) shutdown(ctx context.Context) error {
	w.drain()
	if w.win != nil {
		w.closeWindow()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.finalTimeout)
	defer cancel()
	w.retryAt = time.Time{}
	w.sync(fctx)
	st := w.Status()
	w.log.Info("git worker stopped", "pending", st.Pending)
	if st.Pending == 0 {
		return nil
	}
	cause := st.LastError
	if cause == nil {
		cause = errors.New("no push attempt succeeded")
	}
	return fmt.Errorf("git: %d changes not pushed to branch %q: %w", st.Pending, w.opts.Branch, cause)
}

// drain moves queued submissions into commit windows.
func (w *Worker) drain() {
	w.mu.Lock()
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	for _, s := range q {
		w.accept(s)
	}
}

func (w *Worker) accept(s submission) {
	c := s.change
	if err := validChange(s.targetPath, c.Change); err != nil {
		w.log.Error("change cannot be stored in git; skipped", "err", err,
			"resource", c.GVR.Resource, "namespace", c.Namespace, "name", c.Name, "resourceVersion", c.ResourceVersion)
		w.addPending(-1)
		return
	}
	key := windowKey{targetPath: s.targetPath, target: c.Target, snapshot: c.Snapshot}
	if !c.Snapshot {
		key.username, key.resolved = c.Author.Username, c.Author.Resolved
	}
	if w.win != nil && (w.win.key != key || !time.Now().Before(w.win.deadline)) {
		w.closeWindow()
	}
	if w.win == nil {
		w.win = &window{key: key, deadline: time.Now().Add(w.opts.CommitWindow)}
	}
	w.win.changes = append(w.win.changes, c)
}

func (w *Worker) builder() treeBuilder { return treeBuilder{s: w.repo.Storer} }

func (w *Worker) committer() object.Signature {
	return object.Signature{Name: w.opts.Committer.Name, Email: w.opts.Committer.Email, When: w.opts.Now()}
}

// closeWindow turns the open window into a plan and, when the repository is ready, a commit.
func (w *Worker) closeWindow() {
	win := w.win
	w.win = nil
	p := newPlan(win.key.targetPath, win.changes, w.opts.Committer, w.opts.AuthorEmailDomain, w.opts.Now())
	w.plans = append(w.plans, p)
	if w.repo == nil || w.stale {
		return // materialized by the next rebuild
	}
	sha, ok, err := w.builder().materialize(p, w.localTip, w.committer())
	if err != nil {
		w.stale = true
		w.setError(fmt.Errorf("build commit: %w", err))
		w.log.Error("build commit failed; retrying on the next rebuild", "err", w.redact(err))
		return
	}
	if !ok {
		w.plans = w.plans[:len(w.plans)-1]
		w.addPending(-len(p.changes))
		w.log.Debug("changes leave the tree unchanged; no commit", "changes", len(p.changes))
		return
	}
	w.committed(p, sha)
	w.setLocalTip(sha)
}

func (w *Worker) committed(p *plan, sha plumbing.Hash) {
	p.sha = sha
	if !p.counted {
		p.counted = true
		w.opts.Metrics.commitCreated()
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
		if err != nil {
			return fmt.Errorf("build commit: %w", err)
		}
		if !ok {
			dropped += len(p.changes)
			w.log.Info("changes are already on the branch; no commit", "changes", len(p.changes), "author", p.author.Name)
			continue
		}
		kept = append(kept, p)
		shas = append(shas, sha)
		tip = sha
	}
	for i, p := range kept {
		w.committed(p, shas[i])
	}
	w.plans = kept
	w.stale = false
	w.addPending(-dropped)
	w.setLocalTip(tip)
	return nil
}

func (w *Worker) setLocalTip(sha plumbing.Hash) {
	w.localTip = sha
	if !sha.IsZero() {
		if err := w.repo.Storer.SetReference(plumbing.NewHashReference(w.branch, sha)); err != nil {
			w.log.Error("update local branch reference", "err", err)
		}
	}
	w.mu.Lock()
	if !sha.IsZero() {
		w.status.LastCommit = sha.String()
	}
	w.mu.Unlock()
}

// sync brings the remote up to date when a retry is due: clone, rebuild, push.
func (w *Worker) sync(ctx context.Context) {
	if time.Now().Before(w.retryAt) {
		return
	}
	if w.repo == nil {
		if err := w.open(ctx); err != nil {
			w.failed("clone", err)
			return
		}
	}
	if w.stale {
		if err := w.rebuild(); err != nil {
			w.failed("rebuild", err)
			return
		}
	}
	if len(w.plans) > 0 {
		w.push(ctx)
	}
}

// push pushes the unpushed commits; on a non-fast-forward it fetches, rebuilds them on the new
// remote tip and tries again.
func (w *Worker) push(ctx context.Context) {
	for round := 1; ; round++ {
		start := time.Now()
		err := w.pushOnce(ctx)
		if err == nil || errors.Is(err, gogit.NoErrAlreadyUpToDate) {
			w.opts.Metrics.pushed(pushResultSuccess, time.Since(start))
			w.delivered(len(w.plans))
			return
		}
		moved, ferr := w.refetch(ctx)
		if ferr != nil || !moved {
			w.opts.Metrics.pushed(pushResultError, time.Since(start))
			if ferr != nil {
				err = errors.Join(err, fmt.Errorf("fetch: %w", ferr))
			}
			w.failed("push", err)
			return
		}
		w.opts.Metrics.pushed(pushResultRejected, time.Since(start))
		if len(w.plans) == 0 {
			return // refetch found everything delivered
		}
		if w.stale {
			w.log.Info("remote branch moved; rebuilding unpushed commits on its tip",
				"remote_tip", w.remoteTip.String(), "commits", len(w.plans))
			if err := w.rebuild(); err != nil {
				w.failed("rebuild", err)
				return
			}
		}
		if len(w.plans) == 0 {
			w.failures, w.retryAt = 0, time.Time{}
			return
		}
		if round >= maxRebaseRounds {
			w.failed("push", fmt.Errorf("remote branch kept moving: %w", err))
			return
		}
	}
}

// delivered records that the first n plans are on the remote.
func (w *Worker) delivered(n int) {
	done := w.plans[:n]
	w.plans = append([]*plan(nil), w.plans[n:]...)
	if n > 0 {
		w.remoteTip = done[n-1].sha
	}
	w.failures, w.retryAt = 0, time.Time{}
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
	w.addPending(-changes)
	w.log.Info("pushed", "commits", n, "changes", changes, "tip", w.remoteTip.String())
	if w.opts.OnPushed != nil && n > 0 {
		w.opts.OnPushed(res)
	}
}

// failed records err and schedules the next attempt with exponential backoff.
func (w *Worker) failed(what string, err error) {
	err = w.redact(fmt.Errorf("%s: %w", what, err))
	w.failures++
	d := w.backoff(w.failures)
	w.retryAt = time.Now().Add(d)
	w.setError(err)
	w.log.Warn("git remote operation failed; will retry", "err", err, "retry_in", d,
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
