package git

import (
	"cmp"
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
)

// errNoBranch means the remote has no such branch (or no refs at all): the branch starts from
// scratch, or was deleted.
var errNoBranch = errors.New("remote has no such branch")

// open fetches the tip of the branch into a new working store: its commit and trees, depth 1,
// without blobs when the server can filter them (a commit never reads a blob). This is a
// `git clone --bare --depth 1 --single-branch`, minus the blobs. A remote without the branch
// yields an empty store; the first commit has no parent.
func (w *Worker) open(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	store := memory.NewStorage()
	seen := time.Now()
	tip, err := w.fetchInto(ctx, store, plumbing.ZeroHash, 1, false)
	switch {
	case err == nil:
	case errors.Is(err, errNoBranch):
		w.log.Info("remote branch does not exist yet; it starts with the first commit")
	default:
		return err
	}
	if w.epoch > 0 && !tip.IsZero() {
		if c, err := object.GetCommit(store, tip); err == nil && commitEpoch(c.Message, w.opts.WriterSlot) > w.epoch &&
			signedBy(c, w.currentSigner()) && w.honoured(ctx, commitEpoch(c.Message, w.opts.WriterSlot)) {
			w.store = store // read by nothing more: the worker stops
			w.supersede(commitEpoch(c.Message, w.opts.WriterSlot))
			return errSuperseded
		}
	}
	if err := w.takeInAtOpen(ctx, store, tip); err != nil {
		return err
	}
	compacted, refs, walked, err := compactStore(store, tip, plumbing.ZeroHash)
	if err != nil {
		return err
	}
	w.setStore(compacted, refs, walked)
	w.remoteTip, w.remoteSeen = tip, seen
	w.remoteGone = false
	w.stale = true
	w.failures, w.retryAt = 0, time.Time{}
	w.setError(nil)
	w.setLocalTip(tip)
	w.log.Info("cloned", "tip", tip.String())
	return nil
}

// refetch fetches the branch after a failed push. It reports whether the local state changed so
// that pushing again at once makes sense:
//
//   - the new remote tip's history holds some of our pending commits (an earlier push landed
//     although it reported an error): they are delivered, as after a successful push. If the
//     remote moved on past them, the remaining plans are marked stale, to be rebuilt on its tip;
//   - the remote moved to foreign commits, or was rewound or rewritten by a force-push: the plans
//     are marked stale, to be rebuilt on its tip;
//   - the remote branch was deleted: the next push creates it again.
//
// When the remote moved to commits of someone else (or was rewound or replaced), the folders
// whose tree those commits changed are reported (foreignEdits).
//
// It fetches the new tip's history down to the tip last seen, at most len(plans)+historyScanSlack
// commits deep, and only the trees and commits the working store lacks.
func (w *Worker) refetch(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	seen := time.Now()
	tip, err := w.fetchInto(ctx, w.store, w.remoteTip, len(w.plans)+historyScanSlack+1, false)
	if err == nil || errors.Is(err, errNoBranch) {
		w.remoteSeen = seen
	}
	switch {
	case err == nil:
	case errors.Is(err, errNoBranch):
		if w.remoteGone || w.remoteTip.IsZero() {
			return false, nil
		}
		w.remoteGone, w.held = true, nil
		w.log.Warn("remote branch was deleted; the next push creates it again",
			"old_tip", w.remoteTip.String())
		return true, nil
	default:
		return false, err
	}
	w.remoteGone = false
	if tip == w.remoteTip {
		return false, nil
	}
	old := w.remoteTip
	if newer := w.newerWriter(tip, old, len(w.plans)+historyScanSlack+1); newer > 0 && w.honoured(ctx, newer) {
		w.supersede(newer)
		return false, errSuperseded
	}
	newest, reachedOld, exhausted := w.scanForPlans(tip, old)
	if newest >= 0 {
		w.log.Info("an earlier push reached the remote although it reported an error",
			"commits", newest+1, "remote_tip", tip.String())
		w.delivered(newest + 1)
		if tip == w.remoteTip {
			return true, nil // the remaining plans sit on the remote tip already
		}
	} else if !reachedOld && !old.IsZero() {
		switch {
		case w.gc.known(tip) || w.reaches(old, tip, rewindScanLimit):
			w.gc.rewound(tip)
			w.held = nil // what the commits it dropped carried is gone with them
			w.log.Warn("remote branch was rewound to an older commit (force-push); rebuilding unpushed commits on it",
				"old_tip", old.String(), "new_tip", tip.String(), "commits", len(w.plans))
		case exhausted:
			w.gc.forget()
			w.held = nil
			w.log.Warn("remote branch history was replaced (force-push); rebuilding unpushed commits on its tip",
				"old_tip", old.String(), "new_tip", tip.String(), "commits", len(w.plans))
		}
	}
	w.remoteTip = tip
	w.stale = true
	// What the branch holds now that this worker did not commit: every commit between the tip
	// it last pushed or saw and the new one (carried.go).
	foreign, complete := w.takeIn(w.store, tip, old, len(w.plans)+historyScanSlack+1)
	if !complete {
		w.log.Warn("the branch moved further than the worker fetched; changes the commits it did not see carry may be committed again",
			"old_tip", old.String(), "remote_tip", tip.String())
	}
	switch {
	case old.IsZero(): // the worker pushed nothing to the branch: no folder lost what it pushed
	case complete:
		w.foreignEdits(tip, foreign)
	default:
		w.foreignEditsBetween(old, tip)
	}
	return true, nil
}

// foreignEdits reports, through OnReplay, the open folders that someone else's commits changed
// (foreign, as takeIn found them between the tip the worker last pushed or saw and tip). The
// branch no longer holds what the worker pushed into those folders: their GitTargets' streams
// hand their state over again, so that every file is as the cluster again (an unchanged object
// whose file differs is written again by the committer). Commits of the worker's own slot,
// another replica's or an older epoch's, are not someone else's: what they carry is held
// (carried.go), and the streams hand it over anyway. A folder whose tree cannot be read at a
// commit or its parent counts as changed.
func (w *Worker) foreignEdits(tip plumbing.Hash, foreign []*object.Commit) {
	if w.opts.OnReplay == nil || len(foreign) == 0 {
		return
	}
	tb := w.builder()
	w.replayFolders(tip, func(path string) bool {
		for _, c := range foreign {
			var parent plumbing.Hash
			if len(c.ParentHashes) > 0 {
				parent = c.ParentHashes[0]
			}
			after, aerr := tb.dirAt(c.Hash, path)
			before, berr := tb.dirAt(parent, path)
			if aerr != nil || berr != nil || before != after {
				return true
			}
		}
		return false
	})
}

// foreignEditsBetween is foreignEdits when the commits between base and tip are not all known
// (the branch was rewound or replaced, or moved further than the fetch reached): every open
// folder whose tree differs between them.
func (w *Worker) foreignEditsBetween(base, tip plumbing.Hash) {
	if w.opts.OnReplay == nil {
		return
	}
	tb := w.builder()
	w.replayFolders(tip, func(path string) bool {
		before, berr := tb.dirAt(base, path)
		after, aerr := tb.dirAt(tip, path)
		return berr != nil || aerr != nil || before != after
	})
}

// replayFolders reports through OnReplay the open folders changed says someone else changed.
func (w *Worker) replayFolders(tip plumbing.Hash, changed func(path string) bool) {
	var folders []string
	for key, g := range w.gates {
		if g.state != gateOpen {
			continue // not the worker's folder yet: nothing was pushed there
		}
		if changed(g.path) {
			folders = append(folders, key)
		}
	}
	if len(folders) == 0 {
		return
	}
	slices.Sort(folders)
	w.log.Info("someone else's commits changed folders kubescribe writes; their GitTargets' streams hand their state over again",
		"folders", folders, "remote_tip", tip.String())
	w.opts.OnReplay(ReplayRequest{Folders: folders})
}

// branchCheckAt is when the branch is fetched next while the worker has nothing to push:
// FetchInterval after it was last seen (a clone, fetch or push), not before a retry is due.
// There is no such check without an interval, before the first clone, or while commits or an
// open window wait: their push finds out whether the branch moved.
func (w *Worker) branchCheckAt() (time.Time, bool) {
	every := time.Duration(w.fetchEvery.Load())
	if every <= 0 || w.store == nil || w.stale || w.final || w.win != nil || len(w.plans) > 0 {
		return time.Time{}, false
	}
	at := w.remoteSeen.Add(every)
	if w.retryAt.After(at) {
		at = w.retryAt
	}
	return at, true
}

// checkBranch fetches the branch when branchCheckAt says so. Someone else's commits that changed
// the worker's folders are thus found, and reported through OnReplay (foreignEdits), while
// nothing happens in the cluster; otherwise only the next refused push would find them. While
// the branch did not move, the check reads its advertisement only. A branch found deleted is
// created again (restoreBranch).
func (w *Worker) checkBranch(ctx context.Context) {
	if at, ok := w.branchCheckAt(); !ok || time.Now().Before(at) {
		return
	}
	moved, err := w.refetch(ctx)
	if errors.Is(err, errSuperseded) {
		return
	}
	if err != nil {
		w.opts.Metrics.branchChecked(branchCheckError)
		w.failed(ctx, "fetch", err)
		w.branchCheckFailed = true
		return
	}
	if moved {
		w.opts.Metrics.branchChecked(branchCheckMoved)
		w.idleSince, w.trimmed = time.Time{}, false // trim what the fetch added once idle again
	} else {
		w.opts.Metrics.branchChecked(branchCheckUnchanged)
	}
	if w.remoteGone && !w.localTip.IsZero() {
		w.restoreBranch(ctx)
		return
	}
	if w.branchCheckFailed {
		w.branchCheckFailed = false
		w.failures, w.retryAt = 0, time.Time{}
		w.setError(nil)
		w.log.Info("the branch can be fetched again")
	}
	if w.stale {
		if err := w.rebuild(); err != nil {
			w.failed(ctx, "rebuild", err)
		}
	}
}

// restoreBranch creates the branch again at the worker's last commit, after a check found it
// deleted while the worker had nothing to push: otherwise it would stay deleted until the next
// change in the cluster. The push sends no object, so the server takes it only while it still
// holds the deleted branch's history; once that is garbage-collected, the push is refused and
// the worker starts the branch over (startOver), as a refused push of a change does.
func (w *Worker) restoreBranch(ctx context.Context) {
	start := time.Now()
	err := w.pushCommits(ctx, w.localTip, nil)
	switch {
	case err == nil:
		w.opts.Metrics.pushed(pushResultSuccess, time.Since(start))
		w.remoteTip, w.remoteGone, w.remoteSeen = w.localTip, false, start
		w.branchCheckFailed, w.failures, w.retryAt = false, 0, time.Time{}
		w.setError(nil)
		w.log.Info("the deleted branch is created again at kubescribe's last commit", "tip", w.localTip.String())
	case errors.Is(err, errHistoryLost):
		w.opts.Metrics.pushed(pushResultError, time.Since(start))
		w.startOver(err)
	default:
		w.opts.Metrics.pushed(pushResultError, time.Since(start))
		w.failed(ctx, "push", err)
		w.branchCheckFailed = true // the next check tries again
	}
}

// SetFetchInterval replaces the interval of the branch checks of a running worker
// (Options.FetchInterval); it takes effect at once.
func (w *Worker) SetFetchInterval(d time.Duration) {
	if d < 0 {
		d = 0
	}
	if time.Duration(w.fetchEvery.Swap(int64(d))) == d {
		return
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// scanForPlans looks for pending plans in the history of the remote tip, newest first, without
// walking past stop (the remote tip as last known) and over at most len(plans)+historyScanSlack
// commits. It returns the index of the newest plan found (-1 for none), whether it met stop,
// and whether it saw the whole history it had to look at (no limit was hit).
func (w *Worker) scanForPlans(tip, stop plumbing.Hash) (newest int, reachedStop, exhausted bool) {
	index := make(map[plumbing.Hash]int, len(w.plans))
	for i, p := range w.plans {
		if !p.sha.IsZero() {
			index[p.sha] = i
		}
	}
	newest = -1
	exhausted = w.walkHistory(tip, len(w.plans)+historyScanSlack, func(h plumbing.Hash) bool {
		if i, ok := index[h]; ok {
			// Older plans are its ancestors: no need to look behind it.
			newest = max(newest, i)
			return false
		}
		if h == stop {
			reachedStop = true
			return false
		}
		return true
	})
	return newest, reachedStop, exhausted
}

// reaches reports whether target is in the history of from, looking at most at limit commits.
func (w *Worker) reaches(from, target plumbing.Hash, limit int) bool {
	found := false
	w.walkHistory(from, limit, func(h plumbing.Hash) bool {
		if h == target {
			found = true
		}
		return !found
	})
	return found
}

// walkHistory walks the working store's history from tip (walkCommits).
func (w *Worker) walkHistory(tip plumbing.Hash, limit int, visit func(plumbing.Hash) bool) bool {
	return walkCommits(w.store, tip, limit, visit)
}

// walkCommits visits the commits reachable from tip in s breadth first over all parents, each
// once, at most limit of them; visit returns whether to walk on into a commit's parents.
// Commits missing from s end their path. It reports whether the walk ended by itself rather
// than at the limit.
func walkCommits(s storer.EncodedObjectStorer, tip plumbing.Hash, limit int, visit func(plumbing.Hash) bool) bool {
	if tip.IsZero() {
		return true
	}
	seen := map[plumbing.Hash]bool{tip: true}
	queue := []plumbing.Hash{tip}
	for n := 0; len(queue) > 0; n++ {
		if n >= limit {
			return false
		}
		h := queue[0]
		queue = queue[1:]
		if !visit(h) {
			continue
		}
		c, err := object.GetCommit(s, h)
		if err != nil {
			continue
		}
		for _, p := range c.ParentHashes {
			if !seen[p] {
				seen[p] = true
				queue = append(queue, p)
			}
		}
	}
	return true
}

// pushOnce pushes every unpushed commit; never forced (see pushPlans).
func (w *Worker) pushOnce(ctx context.Context) error {
	return w.pushPlans(ctx, len(w.plans))
}

// redactedError carries a message with the credentials removed. It deliberately does not
// unwrap: the original text would hold the secret.
type redactedError struct{ msg string }

func (e *redactedError) Error() string { return e.msg }

// redact removes the worker's passwords, current and retired, from err's message (see
// Credentials.redact).
func (w *Worker) redact(err error) error {
	w.credsMu.RLock()
	defer w.credsMu.RUnlock()
	err = w.creds.redact(err)
	for _, pw := range w.retired {
		err = Credentials{Password: pw}.redact(err)
	}
	return err
}

// remoteAuth returns the authentication and CA bundle for the next remote operation.
func (w *Worker) remoteAuth() (transport.AuthMethod, []byte) {
	w.credsMu.RLock()
	defer w.credsMu.RUnlock()
	return w.auth, w.creds.CABundle
}

// SetCredentials replaces the credentials of a running worker; the next clone, fetch or push
// uses them. Rotating a token this way keeps everything the worker holds, including commits
// that failed to push with the old one. The credentials are validated as NewWorker does.
// Adopt applies a provider's settings r to the running worker where it can: new credentials and
// a new fetch interval take effect in place. It reports false, changing nothing, when r names
// another repository, committer, commit window or author e-mail domain: only a new worker runs
// with those. The worker is the one holder of its settings; r.Provider is not compared (the
// router keys its workers by provider and branch).
func (w *Worker) Adopt(r Remote) (bool, error) {
	if r.URL != w.opts.URL || r.Committer != w.opts.Committer || r.CommitWindow != w.opts.CommitWindow ||
		r.AuthorEmailDomain != w.opts.AuthorEmailDomain {
		return false, nil
	}
	w.credsMu.Lock()
	same := w.creds.equal(r.Credentials)
	w.credsMu.Unlock()
	if !same {
		if err := w.SetCredentials(r.Credentials); err != nil {
			return false, err
		}
	}
	if signerKey(r.Signer) != signerKey(w.currentSigner()) {
		w.SetSigner(r.Signer)
	}
	w.SetFetchInterval(r.FetchInterval)
	return true, nil
}

// SetSigner replaces the key the worker signs its commits with (nil: unsigned). The commits it
// holds unpushed are built again with it, so none is pushed with a key that was replaced, nor
// unsigned once a key is set; a push already under way finishes with the commits it carries.
func (w *Worker) SetSigner(s Signer) {
	w.credsMu.Lock()
	before := w.signer
	w.signer = s
	w.credsMu.Unlock()
	w.resign.Store(true)
	select {
	case w.wake <- struct{}{}:
	default:
	}
	w.log.Info("commit signing key replaced; unpushed commits are built again with it",
		"from", cmp.Or(signerKey(before), "none (unsigned)"), "to", cmp.Or(signerKey(s), "none (unsigned)"))
}

func (w *Worker) currentSigner() Signer {
	w.credsMu.RLock()
	defer w.credsMu.RUnlock()
	return w.signer
}

// Remote reports the settings the worker runs with; Provider is left empty.
func (w *Worker) Remote() Remote {
	w.credsMu.Lock()
	creds := w.creds
	w.credsMu.Unlock()
	return Remote{URL: w.opts.URL, Credentials: creds, Committer: w.opts.Committer, Signer: w.currentSigner(), CommitWindow: w.opts.CommitWindow,
		AuthorEmailDomain: w.opts.AuthorEmailDomain, FetchInterval: time.Duration(w.fetchEvery.Load())}
}

func (w *Worker) SetCredentials(c Credentials) error {
	auth, err := authFor(w.opts.URL, c)
	if err != nil {
		return err
	}
	w.credsMu.Lock()
	if w.creds.Password != "" && w.creds.Password != c.Password {
		w.retired = append(w.retired, w.creds.Password)
	}
	w.creds = c
	w.auth = auth
	w.credsMu.Unlock()
	w.log.Info("credentials replaced; the next remote operation uses them")
	return nil
}

// redact removes the password (plain and URL-escaped) from err's message. Errors that do not
// contain it are returned unchanged, keeping errors.Is/As working.
func (c Credentials) redact(err error) error {
	if err == nil {
		return nil
	}
	pw := c.Password
	if pw == "" {
		return err
	}
	msg := err.Error()
	out := msg
	for _, s := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw)} {
		out = strings.ReplaceAll(out, s, "<redacted>")
	}
	if out == msg {
		return err
	}
	return &redactedError{msg: out}
}
