package git

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/memory"
	"k8s.io/apimachinery/pkg/types"
)

// The writer-side folder gate. Before the first commit of a GitTarget into its folder, the
// worker scans the folder as the branch holds it with pkg/manifestanalyzer, the engine behind
// `kubescribe scan`, so the two cannot disagree. Until the folder passes, the changes for it
// are held in order: nothing is committed, so no resume cursor advances past them, and they are
// committed as soon as the folder passes (someone fixed it). A refused folder is checked again
// each time the branch tip moved, looked at every gateRecheck.
//
// The working store holds the tip's trees and, on a server that filters, no blobs. A check
// fetches just the blobs of the folder, by id, as a partial clone's lazy fetch does; a server
// that refuses such wants is read with one depth-1 fetch of the tip with its blobs instead. No
// blob is fetched for a folder that is absent, or that is exactly the tree kubescribe last
// pushed there (Options.KnownFolder).

// defaultGateRecheck is how often a refused folder is looked at again: a fetch of the branch's
// advertisement, and a new scan only when the folder's tree changed.
const defaultGateRecheck = 30 * time.Second

type gateState int

const (
	gateUnchecked gateState = iota // not checked yet, or the last check failed and is retried
	gateOpen                       // adoptable or kubescribe's own: its changes are committed
	gateRefused                    // not adoptable: its changes are held
)

// folderGate is the gate of one folder of the branch.
type folderGate struct {
	path  string
	state gateState
	// tree is the folder's tree the refusal is about (gateRefused): it is not scanned again.
	tree plumbing.Hash
	// held are the folder's submissions, oldest first, while the gate is not open; targets
	// are the GitTargets they belong to (a close request of theirs waits behind them).
	held    []submission
	targets map[types.NamespacedName]bool
	checkAt time.Time // real clock; zero = at once
}

// Folder check results, the values of kubescribe_git_folder_checks_total's "result" label.
const (
	folderCheckAdoptable = "adoptable"
	folderCheckRefused   = "refused"
	// folderCheckKnown: absent, or the tree kubescribe last pushed there: not scanned.
	folderCheckKnown = "known"
	folderCheckError = "error"
)

// Fetches made by folder checks, the values of kubescribe_git_folder_check_fetches_total's
// "kind" label.
const (
	folderFetchBlobs = "blobs" // the folder's blobs, by id
	folderFetchFull  = "full"  // the tip with every blob: the server refused the blob ids
)

// gateFor returns the gate of folder targetPath, creating an unchecked one.
func (w *Worker) gateFor(targetPath string) *folderGate {
	p := folderKey(targetPath)
	g := w.gates[p]
	if g == nil {
		g = &folderGate{path: p}
		w.gates[p] = g
	}
	return g
}

// hold keeps s behind the folder's gate.
func (g *folderGate) hold(s submission) {
	g.held = append(g.held, s)
	if s.close == nil {
		if g.targets == nil {
			g.targets = map[types.NamespacedName]bool{}
		}
		g.targets[s.change.Target] = true
	}
}

// heldFor returns the closed gate that holds changes of target, if any.
func (w *Worker) heldFor(target types.NamespacedName) *folderGate {
	for _, g := range w.gates {
		if g.state != gateOpen && g.targets[target] {
			return g
		}
	}
	return nil
}

// refusedChanges counts the changes held for folders that were refused.
func (w *Worker) refusedChanges() int {
	n := 0
	for _, g := range w.gates {
		if g.state != gateRefused {
			continue
		}
		for _, s := range g.held {
			if s.close == nil {
				n++
			}
		}
	}
	return n
}

// PrepareFolder tells the worker that a GitTarget writes to folder targetPath: the folder is
// checked now rather than with the first change for it, so a refusal shows before anything is
// written. Already checked folders are not checked again.
func (w *Worker) PrepareFolder(targetPath string) {
	w.mu.Lock()
	if !w.stopping {
		w.queue = append(w.queue, submission{targetPath: folderKey(targetPath), prepare: true})
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// ForgetFolder tells the worker that no GitTarget writes to folder targetPath any more: changes
// it holds for a folder that did not pass are dropped (they were never committed, so nothing
// recorded them as written), and the folder is checked again before a later first commit.
func (w *Worker) ForgetFolder(targetPath string) {
	p := folderKey(targetPath)
	w.mu.Lock()
	if !w.stopped {
		w.queue = append(w.queue, submission{targetPath: p, forget: true})
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// forgetGate handles a ForgetFolder submission.
func (w *Worker) forgetGate(p string) {
	g := w.gates[p]
	if g == nil {
		return
	}
	delete(w.gates, p)
	w.setRefusal(p, nil)
	changes := 0
	for _, s := range g.held {
		if s.close != nil {
			w.reportClose(s.close.ID, CloseNoOpenWindow)
			continue
		}
		changes++
	}
	if changes > 0 {
		w.addPending(-changes)
		w.log.Info("no GitTarget writes to the folder any more; the changes held for it are dropped",
			"folder", p, "changes", changes)
	}
}

// FolderRefusal reports why folder targetPath may not be written to, or nil: it did not pass
// the gate yet, or it passed.
func (w *Worker) FolderRefusal(targetPath string) *FolderRefusedError {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refusals[folderKey(targetPath)]
}

func (w *Worker) setRefusal(p string, err *FolderRefusedError) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.refusals, p)
		return
	}
	w.refusals[p] = err
}

// checkGates checks the folders that did not pass yet. Before a refused
// folder is looked at again, the branch is fetched (only its advertisement when it did not
// move).
func (w *Worker) checkGates(ctx context.Context) {
	if w.store == nil || w.stale {
		return
	}
	now := time.Now()
	var due []*folderGate
	recheck := false
	for _, g := range w.gates {
		if g.state != gateOpen && !now.Before(g.checkAt) {
			due = append(due, g)
			recheck = recheck || g.state == gateRefused
		}
	}
	if len(due) == 0 {
		return
	}
	slices.SortFunc(due, func(a, b *folderGate) int { return strings.Compare(a.path, b.path) })
	if recheck && w.final {
		return // the final push does not wait for a folder someone may have fixed
	}
	if recheck && len(w.plans) == 0 {
		// With commits to push, the push finds out whether the branch moved.
		if _, err := w.refetch(ctx); err != nil {
			w.failed(ctx, "fetch", err)
			return
		}
		if w.stale {
			if err := w.rebuild(); err != nil {
				w.failed(ctx, "rebuild", err)
				return
			}
		}
	}
	for _, g := range due {
		if !w.checkGate(ctx, g) {
			return
		}
	}
}

// checkGate checks one folder at the local tip (the remote tip, plus commits of other folders
// not pushed yet). It returns false when the check failed; it is retried with backoff.
func (w *Worker) checkGate(ctx context.Context, g *folderGate) bool {
	tree, err := w.builder().dirAt(w.localTip, g.path)
	if errors.Is(err, errNotAFolder) {
		if g.state == gateRefused && g.tree.IsZero() {
			g.checkAt = time.Now().Add(w.gateRecheck)
			return true // still a file: still refused
		}
		w.refuseGate(g, plumbing.ZeroHash, &FolderRefusedError{Path: g.path, Detail: err.Error()})
		return true
	}
	if err != nil {
		w.opts.Metrics.folderChecked(folderCheckError)
		w.failed(ctx, "check folder", err)
		w.checkFailed = true
		return false
	}
	if tree.IsZero() || (w.opts.KnownFolder != nil && w.opts.KnownFolder(g.path, tree)) {
		w.opts.Metrics.folderChecked(folderCheckKnown)
		if tree.IsZero() {
			w.log.Debug("folder does not exist yet; nothing to check", "folder", g.path)
		} else {
			w.log.Info("folder is as kubescribe's last push left it; not read again", "folder", g.path, "tree", tree.String())
		}
		w.openGate(g)
		return true
	}
	if g.state == gateRefused && g.tree == tree {
		g.checkAt = time.Now().Add(w.gateRecheck)
		return true // unchanged: still refused
	}
	err = w.scanFolder(ctx, tree, g.path)
	var refused *FolderRefusedError
	switch {
	case err == nil:
		w.opts.Metrics.folderChecked(folderCheckAdoptable)
		w.log.Info("folder checked: it may become a GitTarget's folder", "folder", g.path)
		w.openGate(g)
	case errors.As(err, &refused):
		w.refuseGate(g, tree, refused)
	default:
		if w.interrupted(ctx) {
			return false
		}
		w.opts.Metrics.folderChecked(folderCheckError)
		w.failed(ctx, "check folder", fmt.Errorf("folder %q: %w", g.path, err))
		w.checkFailed = true
		return false
	}
	if w.checkFailed {
		// The failure was the check's, and it could decide now.
		w.checkFailed = false
		w.failures = 0
		w.setError(nil)
	}
	return true
}

// openGate lets the folder's held submissions through, ahead of anything queued since.
func (w *Worker) openGate(g *folderGate) {
	wasRefused := g.state == gateRefused
	g.state = gateOpen
	held := g.held
	g.held, g.targets, g.tree = nil, nil, plumbing.ZeroHash
	if w.final {
		// Shutdown: the final commit takes them, as it took everything submitted before it.
		w.setRefusal(g.path, nil)
		w.acceptAll(held)
		if w.win != nil {
			w.closeWindow()
		}
	} else {
		w.mu.Lock()
		delete(w.refusals, g.path)
		w.queue = append(held[:len(held):len(held)], w.queue...)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	if wasRefused {
		w.log.Info("folder passes now; the changes held for it are committed", "folder", g.path, "submissions", len(held))
	}
	if w.opts.OnFolder != nil {
		w.opts.OnFolder(g.path)
	}
}

// refuseGate records a refusal; the folder is looked at again after gateRecheck.
func (w *Worker) refuseGate(g *folderGate, tree plumbing.Hash, err *FolderRefusedError) {
	w.opts.Metrics.folderChecked(folderCheckRefused)
	g.state, g.tree = gateRefused, tree
	g.checkAt = time.Now().Add(w.gateRecheck)
	w.setRefusal(g.path, err)
	w.log.Warn("folder may not become a GitTarget's folder; its changes are held until it is fixed",
		"folder", g.path, "codes", err.codeList(), "held", len(g.held), "err", err)
	if w.opts.OnFolder != nil {
		w.opts.OnFolder(g.path)
	}
}

// blobBatch is how many blobs one fetch of a folder check asks for. The check holds one batch
// at a time, so its memory is bounded by a batch (about 2,048 manifests of a few KB), not by
// the folder: a 100,000-file folder is read in 49 requests.
const blobBatch = 2048

// scanFolder runs the analyzer over folder p, whose tree is tree. The blobs the working store
// lacks are fetched by id, a batch at a time, as the analyzer reaches them (blobLoader).
func (w *Worker) scanFolder(ctx context.Context, tree plumbing.Hash, p string) error {
	l := &blobLoader{w: w, ctx: ctx, folder: p, batchOf: map[plumbing.Hash]int{}, cur: -1}
	if err := l.plan(tree); err != nil {
		return err
	}
	t, err := object.GetTree(overlayStore{EncodedObjectStorer: w.store, loader: l}, tree)
	if err != nil {
		return fmt.Errorf("read folder %q: %w", p, err)
	}
	err = checkTree(ctx, t, p)
	if l.err != nil {
		// A file the analyzer could not read for lack of its blob is no finding: the check
		// failed, and is retried.
		return l.err
	}
	return err
}

// blobLoader fetches the blobs of a folder the working store lacks, in batches of blobBatch in
// the order the analyzer reads them (fs.WalkDir: by name, folder by folder), keeping only the
// current batch. A server that refuses blob ids is read once with a depth-1 fetch of the tip
// with every blob instead (full).
type blobLoader struct {
	w      *Worker
	ctx    context.Context
	folder string
	// batches of the manifests' blobs, in reading order; batchOf says where each is.
	batches [][]plumbing.Hash
	batchOf map[plumbing.Hash]int
	cur     int
	store   *memory.Storage // the current batch
	full    *memory.Storage // after the fallback: the whole tip
	served  bool            // a fetch by id succeeded: the server accepts ids
	err     error           // the first failure; the check fails with it
}

// plan lists the blobs below tree that the working store lacks. The manifests (.yaml, .yml,
// .json: what the analyzer reads) are batched; any other file is fetched alone if it is read.
func (l *blobLoader) plan(tree plumbing.Hash) error {
	tb := l.w.builder()
	var order []plumbing.Hash
	var walk func(h plumbing.Hash) error
	walk = func(h plumbing.Hash) error {
		t, err := tb.tree(h)
		if err != nil {
			return err
		}
		idx := make([]int, len(t.ents))
		for i := range idx {
			idx[i] = i
		}
		slices.SortFunc(idx, func(a, b int) int { return strings.Compare(string(t.ents[a].name), string(t.ents[b].name)) })
		for _, i := range idx {
			e, sub := t.ents[i], t.hashAt(i)
			switch {
			case e.mode == filemode.Submodule:
			case e.mode == filemode.Dir:
				if err := walk(sub); err != nil {
					return err
				}
			case !isManifestName(string(e.name)):
			case l.w.store.HasEncodedObject(sub) == nil:
			default:
				if _, ok := l.batchOf[sub]; !ok {
					l.batchOf[sub] = len(order) / l.w.gateBatch
					order = append(order, sub)
				}
			}
		}
		return nil
	}
	if err := walk(tree); err != nil {
		return err
	}
	for len(order) > 0 {
		n := min(l.w.gateBatch, len(order))
		l.batches = append(l.batches, order[:n:n])
		order = order[n:]
	}
	return nil
}

// isManifestName reports whether the analyzer reads a file of that name.
func isManifestName(name string) bool {
	switch path.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// fetch runs one fetch of the check, bounded like every remote operation.
func (l *blobLoader) fetch(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(l.ctx, l.w.opTimeout)
	defer cancel()
	return f(ctx)
}

// blob returns blob h, fetching its batch (or it alone) when it is not at hand.
func (l *blobLoader) blob(h plumbing.Hash) (plumbing.EncodedObject, error) {
	if l.err != nil {
		return nil, l.err
	}
	if l.full != nil {
		obj, err := l.full.EncodedObject(plumbing.BlobObject, h)
		if err != nil {
			l.err = fmt.Errorf("the remote did not send blob %s of the folder (the branch moved?); checking again", h)
		}
		return obj, l.err
	}
	i, batched := l.batchOf[h]
	if !batched || i != l.cur {
		wants := []plumbing.Hash{h}
		if batched {
			wants = l.batches[i]
		}
		store := memory.NewStorage()
		l.store = nil // the previous batch is not needed any more
		if err := l.fetch(func(ctx context.Context) error { return l.w.fetchBlobs(ctx, store, wants) }); err != nil {
			if l.ctx.Err() != nil || l.served {
				// Cut short, or a server that served ids before: not a refusal of ids.
				l.err = err
				return nil, err
			}
			l.w.log.Warn("the remote did not serve the folder's files by id; reading them from a fetch of the whole branch tip instead",
				"folder", l.folder, "err", l.w.redact(err))
			full := memory.NewStorage()
			if err := l.fetch(func(ctx context.Context) error {
				_, err := l.w.fetchInto(ctx, full, plumbing.ZeroHash, 1, true)
				return err
			}); err != nil {
				l.err = fmt.Errorf("fetch the branch tip with its files: %w", err)
				return nil, l.err
			}
			l.w.opts.Metrics.folderFetched(folderFetchFull)
			l.full = full
			return l.blob(h)
		}
		l.w.opts.Metrics.folderFetched(folderFetchBlobs)
		l.served = true
		if batched {
			l.store, l.cur = store, i
		} else {
			obj, err := store.EncodedObject(plumbing.BlobObject, h)
			if err != nil {
				l.err = fmt.Errorf("the remote did not send blob %s of the folder (the branch moved?); checking again", h)
			}
			return obj, l.err
		}
	}
	obj, err := l.store.EncodedObject(plumbing.BlobObject, h)
	if err != nil {
		l.err = fmt.Errorf("the remote did not send blob %s of the folder (the branch moved?); checking again", h)
		return nil, l.err
	}
	return obj, nil
}

// overlayStore reads the blobs the working store lacks through loader, everything else from
// the working store, to which it writes (a scan writes nothing).
type overlayStore struct {
	storer.EncodedObjectStorer
	loader *blobLoader
}

func (o overlayStore) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	obj, err := o.EncodedObjectStorer.EncodedObject(t, h)
	if err == nil || (t != plumbing.BlobObject && t != plumbing.AnyObject) {
		return obj, err
	}
	return o.loader.blob(h)
}

// errNotAFolder: a GitTarget's folder, or a folder above it, is a file on the branch.
var errNotAFolder = errors.New("is a file on the branch, not a folder")

// dirAt returns the tree at folder p of commit tip; zero when tip is zero or the folder is
// absent.
func (tb treeBuilder) dirAt(tip plumbing.Hash, p string) (plumbing.Hash, error) {
	if tip.IsZero() {
		return plumbing.ZeroHash, nil
	}
	c, err := object.GetCommit(tb.s, tip)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("read commit %s: %w", tip, err)
	}
	return tb.dirIn(c.TreeHash, p)
}

// dirIn returns the tree at folder p of tree root; zero when it is absent, an error wrapping
// errNotAFolder when p or a folder above it is a file.
func (tb treeBuilder) dirIn(root plumbing.Hash, p string) (plumbing.Hash, error) {
	if p == "" {
		return root, nil
	}
	segs := strings.Split(p, "/")
	h, file, err := tb.descend(root, segs)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if file >= 0 {
		return plumbing.ZeroHash, fmt.Errorf("%q %w", strings.Join(segs[:file+1], "/"), errNotAFolder)
	}
	return h, nil
}
