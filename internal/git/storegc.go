package git

import (
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"
)

// The working store is kept small by dropping what the commits made obsolete. A full compaction
// (compactStore) copies the tip's trees into a new store, which costs a walk of every tree of
// the tip: 35 ms for 100,000 files, after every 2 MiB of new objects, about every 50 commits
// into such a repository, where the commit itself takes 0.1 ms. Between full compactions the
// store is pruned instead, at a cost that depends on what the commits wrote, not on the
// repository's size: every tree a commit writes replaces the tree at the same path in its
// parent, so the store counts, for each tree of the local tip, at how many paths of it the tree
// sits. A tree whose count drops to zero is in no path of the tip any more; once no unpushed
// commit needs it either, it is deleted. A count can only be too high (a directory that vanished
// keeps the counts of the trees below it), never too low, so pruning never deletes a tree in
// use; what it leaves behind, the next full compaction drops.

// pruneLeakFactor: a full compaction replaces pruning once the store holds this many times the
// objects pruning accounts for (the tip's trees, the unpushed objects, and historyLimit more
// for what a fetch brought in).
const pruneLeakFactor = 2

// storeGC is what a worker knows to prune its working store between full compactions, and the
// branch's recent history.
type storeGC struct {
	// refs counts the paths of the local tip's tree at which each of its trees sits; nil when
	// unknown (the store was rebuilt or filled from elsewhere): the next compaction is full.
	refs map[plumbing.Hash]int32
	// dead are trees whose count dropped to zero since the last pruning.
	dead []plumbing.Hash
	// history is the hashes of the branch's commits that the worker built or fetched, oldest
	// first, at most historyLimit of them, to recognise a branch rewound to one of them. Only
	// hashes: the store keeps no commit object but the local tip's, the remote tip's and the
	// unpushed ones (1,000 commit objects were about 0.9 MB, for one log line's wording).
	history []plumbing.Hash
	// historyLimit is rewindScanLimit; test seam.
	historyLimit int
}

func newStoreGC() *storeGC { return &storeGC{historyLimit: rewindScanLimit} }

// reset starts over from a full compaction whose tip has the path counts refs (nil: unknown)
// and whose history, as far as the compacted store held it, is walked (newest first).
func (g *storeGC) reset(refs map[plumbing.Hash]int32, walked []plumbing.Hash) {
	g.refs, g.dead = refs, nil
	g.remember(walked)
}

// invalidate forgets the counts: the local tip was not built by commits on the last one.
func (g *storeGC) invalidate() { g.refs, g.dead = nil, nil }

// remember adds commits of the branch, newest first, as the newest of its history.
func (g *storeGC) remember(walked []plumbing.Hash) {
	if len(walked) == 0 {
		return
	}
	in := make(map[plumbing.Hash]bool, len(walked))
	for _, h := range walked {
		in[h] = true
	}
	history := make([]plumbing.Hash, 0, len(g.history)+len(walked))
	for _, h := range g.history {
		if !in[h] {
			history = append(history, h)
		}
	}
	for i := len(walked) - 1; i >= 0; i-- {
		history = append(history, walked[i])
	}
	g.history = history
	g.trimHistory()
}

// trimHistory drops the oldest hashes beyond historyLimit once there are twice as many, so
// that a commit does not copy the list.
func (g *storeGC) trimHistory() {
	if len(g.history) >= 2*g.historyLimit {
		g.history = append(g.history[:0:0], g.history[len(g.history)-g.historyLimit:]...)
	}
}

// known reports whether h is one of the commits of the branch's recent history.
func (g *storeGC) known(h plumbing.Hash) bool {
	n := len(g.history)
	for i := n - 1; i >= 0 && i >= n-g.historyLimit; i-- {
		if g.history[i] == h {
			return true
		}
	}
	return false
}

// rewound makes tip the newest commit of the history: the branch was reset to it.
func (g *storeGC) rewound(tip plumbing.Hash) {
	for i := len(g.history) - 1; i >= 0; i-- {
		if g.history[i] == tip {
			g.history = g.history[:i+1]
			return
		}
	}
}

// forget drops the history: the branch was replaced by another.
func (g *storeGC) forget() { g.history = nil }

// committed accounts for commit sha, which was built on the local tip the counts describe and
// wrote objs into s.
func (g *storeGC) committed(s *memory.Storage, sha plumbing.Hash, objs []packObject) {
	g.history = append(g.history, sha)
	g.trimHistory()
	if g.refs == nil {
		return
	}
	for _, o := range objs {
		if _, tree := s.Trees[o.hash]; !tree {
			continue
		}
		g.refs[o.hash]++
		if o.base.IsZero() {
			continue
		}
		// A base without a count is no tree of the tip the counts know: leave it alone.
		if n, ok := g.refs[o.base]; ok {
			if n <= 1 {
				g.refs[o.base] = 0
				g.dead = append(g.dead, o.base)
			} else {
				g.refs[o.base] = n - 1
			}
		}
	}
}

// prune deletes from s what the local tip and the unpushed commits no longer need: the trees no
// path of the tip holds, the blobs (commits never read them), and the commits. keep are the
// objects of the unpushed commits, the trees they replaced, the local tip's commit and the
// remote tip's: what the next commit, the push and a rebuild on the remote tip read. It reports false
// when the counts cannot be trusted (it deletes nothing then) or when more is left behind than
// it accounts for: the caller compacts in full.
func (g *storeGC) prune(s *memory.Storage, keep map[plumbing.Hash]bool) bool {
	if g.refs == nil {
		return false
	}
	for _, h := range g.dead {
		if g.refs[h] != 0 || keep[h] {
			continue // back in the tip, or the remote tip's
		}
		delete(g.refs, h)
		delete(s.Trees, h)
		delete(s.Objects, h)
	}
	g.dead = g.dead[:0]
	for h := range s.Blobs {
		if !keep[h] {
			delete(s.Blobs, h)
			delete(s.Objects, h)
		}
	}
	for h := range s.Commits {
		if !keep[h] {
			delete(s.Commits, h)
			delete(s.Objects, h)
		}
	}
	accounted := len(g.refs) + len(keep) + g.historyLimit
	return len(s.Objects) <= pruneLeakFactor*accounted
}
