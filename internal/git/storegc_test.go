package git

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// walkTrees returns every tree of commit c's tree, failing when one is missing from s.
func walkTrees(t *testing.T, s *memory.Storage, c plumbing.Hash) map[plumbing.Hash]bool {
	t.Helper()
	cm, err := object.GetCommit(s, c)
	require.NoError(t, err, "commit %s", c)
	found := map[plumbing.Hash]bool{}
	stack := []plumbing.Hash{cm.TreeHash}
	for len(stack) > 0 {
		h := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		obj, ok := s.Trees[h]
		require.True(t, ok, "tree %s of commit %s is missing", h, c)
		found[h] = true
		raw, err := readObject(obj)
		require.NoError(t, err)
		require.NoError(t, eachSubtree(h, raw, func(sub plumbing.Hash) { stack = append(stack, sub) }))
	}
	return found
}

// Pruning keeps every tree of the tip and of the commits not pushed yet (through the objects
// they created and the trees they replaced), whatever the changes: updates, creates, deletes
// that empty directories, reverts to earlier contents, and identical directories at several
// paths. What it drops is no tree of those commits.
func TestStoreGCPruneKeepsWhatIsNeeded(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { pruneKeepsWhatIsNeeded(t, seed) })
	}
}

func pruneKeepsWhatIsNeeded(t *testing.T, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 11))
	committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
	self := Signature{Name: "kubescribe", Email: "k@example.com"}
	// Manifests that do not name their namespace, from a small set of contents: directories of
	// equal content in several namespaces, and contents that come back.
	change := func(op watch.Op, ns, name string) attribution.AttributedChange {
		c := cmChange(op, ns, name, "")
		if op != watch.OpDelete {
			c.Manifest = []byte(fmt.Sprintf("kind: ConfigMap\ndata: %d\n", rnd.IntN(3)))
		}
		return by("alice", "a", c)
	}
	var seeded []attribution.AttributedChange
	for ns := range 4 {
		for name := range 3 {
			seeded = append(seeded, change(watch.OpUpdate, fmt.Sprintf("ns-%d", ns), fmt.Sprintf("cm-%d", name)))
		}
	}
	tb, tip, refs := seededStore(t, seeded)
	store := tb.s.(*memory.Storage)
	gc := newStoreGC()
	gc.historyLimit = 5
	gc.reset(refs, nil)

	var unpushed []*plan
	pruned, full := 0, 0
	for i := range 600 {
		ns, name := fmt.Sprintf("ns-%d", rnd.IntN(5)), fmt.Sprintf("cm-%d", rnd.IntN(4))
		op := watch.OpUpdate
		if rnd.IntN(4) == 0 {
			op = watch.OpDelete
		}
		p := newPlan("", []attribution.AttributedChange{change(op, ns, name)}, self, "users.example.com", fixedNow)
		sha, ok, err := tb.materialize(p, tip, committer)
		require.NoError(t, err)
		if !ok {
			continue
		}
		p.sha = sha
		gc.committed(store, sha, p.objects)
		tip = sha
		unpushed = append(unpushed, p)
		if rnd.IntN(3) == 0 {
			unpushed = unpushed[rnd.IntN(len(unpushed)+1):] // a push of the first ones
		}
		if i%7 != 0 {
			continue
		}
		needed := map[plumbing.Hash]bool{}
		var keep []plumbing.Hash
		for _, p := range unpushed {
			for _, o := range p.objects {
				needed[o.hash] = true
				keep = append(keep, o.hash)
				if !o.base.IsZero() {
					needed[o.base] = true
				}
			}
		}
		remote := tip
		if len(unpushed) > 0 {
			cm, err := object.GetCommit(store, unpushed[0].sha)
			require.NoError(t, err)
			remote = cm.ParentHashes[0]
		}
		needed[remote], needed[tip] = true, true
		if gc.prune(store, needed) {
			pruned++
		} else {
			full++
			var walked []plumbing.Hash
			store, refs, walked, err = compactStore(store, tip, remote, keep...)
			require.NoError(t, err)
			gc.reset(refs, walked)
			tb.s = store
		}
		walkTrees(t, store, tip)
		walkTrees(t, store, remote)
		for _, p := range unpushed {
			walkTrees(t, store, p.sha)
		}
		for h := range store.Blobs {
			require.True(t, needed[h], "blob %s of a pushed commit stays", h)
		}
		for h := range store.Commits {
			require.True(t, needed[h], "commit %s, neither a tip nor unpushed, stays", h)
		}
		require.Less(t, len(gc.history), 2*gc.historyLimit)
		require.True(t, gc.known(tip), "the local tip is in the history")
	}
	require.Positive(t, pruned)
	t.Logf("seed %d: pruned %d times, compacted in full %d times", seed, pruned, full)
}

// Pruning deletes what the commits superseded: after a stream of pushed commits the store holds
// the tip's commit and trees and nothing else; the history is kept as hashes.
func TestStoreGCPruneDeletesSupersededTrees(t *testing.T) {
	tb, tip, refs := seededBuilder(t, 300)
	store := tb.s.(*memory.Storage)
	gc := newStoreGC()
	gc.historyLimit = 10
	gc.reset(refs, nil)
	committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
	self := Signature{Name: "kubescribe", Email: "k@example.com"}
	var shas []plumbing.Hash
	for i := range 50 {
		p := newPlan("", []attribution.AttributedChange{benchChange((i*37)%300, fmt.Sprintf("v%d", i))}, self, "users.example.com", fixedNow)
		sha, ok, err := tb.materialize(p, tip, committer)
		require.NoError(t, err)
		require.True(t, ok)
		gc.committed(store, sha, p.objects)
		tip = sha
		shas = append(shas, sha)
	}
	require.True(t, gc.prune(store, map[plumbing.Hash]bool{tip: true}))
	trees := walkTrees(t, store, tip)
	require.Len(t, store.Trees, len(trees), "only the tip's trees stay")
	require.Empty(t, store.Blobs)
	require.Len(t, store.Commits, 1, "only the tip's commit stays")
	for i, h := range shas {
		require.Equal(t, i >= len(shas)-gc.historyLimit, gc.known(h), "commit %d is known as history only among the last historyLimit", i)
	}
}

// A count that cannot be trusted makes prune decline, so that the caller compacts in full.
func TestStoreGCInvalidDeclines(t *testing.T) {
	tb, _, refs := seededBuilder(t, 10)
	gc := newStoreGC()
	gc.reset(refs, nil)
	gc.invalidate()
	n := len(tb.s.(*memory.Storage).Objects)
	require.False(t, gc.prune(tb.s.(*memory.Storage), nil))
	require.Len(t, tb.s.(*memory.Storage).Objects, n)
}

// An idle worker puts its paged trees back into one piece each, with the same content.
func TestFlattenTrees(t *testing.T) {
	tb, tip, _ := seededBuilder(t, 20000) // 200 namespaces: a root of about 8 KB
	store := tb.s.(*memory.Storage)
	committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
	self := Signature{Name: "kubescribe", Email: "k@example.com"}
	for i := range 3 {
		p := newPlan("", []attribution.AttributedChange{benchChange(i*7000, fmt.Sprintf("v%d", i))}, self, "users.example.com", fixedNow)
		sha, ok, err := tb.materialize(p, tip, committer)
		require.NoError(t, err)
		require.True(t, ok)
		tip = sha
	}
	paged := 0
	for _, obj := range store.Trees {
		if o, ok := obj.(*rawObject); ok && o.c.paged() {
			paged++
		}
	}
	require.Positive(t, paged, "a patched root of 200 namespaces is paged")

	flattenTrees(store)
	for h, obj := range store.Trees {
		o, ok := obj.(*rawObject)
		if !ok {
			continue
		}
		require.False(t, o.c.paged(), "tree %s is in one piece", h)
		require.Equal(t, h, hashObject(plumbing.TreeObject, o.c), "tree %s keeps its content", h)
	}
	walkTrees(t, store, tip)
	p := newPlan("", []attribution.AttributedChange{benchChange(15000, "after")}, self, "users.example.com", fixedNow)
	_, ok, err := tb.materialize(p, tip, committer)
	require.NoError(t, err)
	require.True(t, ok, "a commit on the flattened trees")
}
