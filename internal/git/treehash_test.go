package git

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"
)

// A patched tree hashed from its base's marks has the name of the same content hashed whole,
// wherever the patch falls, through chains of patches.
func TestHashTreeResumesFromBaseMarks(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{100, hashMarkMin - 1, hashMarkMin, hashMarkMin + 1, 5 * hashMarkStride, 34*hashMarkStride + 7, 410_000} {
		raw := make([]byte, size)
		for i := range raw {
			raw[i] = byte(rnd.Uint32())
		}
		h, marks := hashTree(flatContent(raw), nil, 0)
		require.Equal(t, newRawObject(plumbing.TreeObject, raw).h, h, "size %d", size)
		require.Equal(t, size >= hashMarkMin, marks != nil, "size %d", size)
		require.LessOrEqual(t, len(marks), hashMarksMax*sha1StateSize)
		base := &parsedTree{content: flatContent(raw), marks: marks}
		for round := range 50 {
			lo := rnd.IntN(size - hashSize)
			switch round % 5 {
			case 0:
				lo = 0
			case 1:
				lo = size - hashSize
			case 2:
				lo = lo / markStride(size) * markStride(size) // on a mark
			case 3:
				lo = max(0, lo/treePageSize*treePageSize-hashSize/2) // across two pages
			}
			var patch hashPatch
			patch.off = lo
			for i := range patch.h {
				patch.h[i] = byte(rnd.Uint32())
			}
			next := base.content.patched([]hashPatch{patch})
			want := slices.Clone(base.content.bytes())
			copy(want[lo:], patch.h[:])
			require.Equal(t, want, next.bytes(), "size %d round %d lo %d", size, round, lo)
			h, marks := hashTree(next, base, lo)
			require.Equal(t, newRawObject(plumbing.TreeObject, want).h, h, "size %d round %d lo %d", size, round, lo)
			base = &parsedTree{content: next, marks: marks}
		}
		// A base of another length is not resumed from.
		longer := append(slices.Clone(raw), 1, 2, 3)
		h, _ = hashTree(flatContent(longer), &parsedTree{content: flatContent(raw), marks: marks}, len(raw))
		require.Equal(t, newRawObject(plumbing.TreeObject, longer).h, h, "size %d", size)
	}
}

// find locates entries by binary search in Git's order, where a directory sorts as if its name
// ended in '/', and falls back to a scan in a tree a foreign writer left unsorted.
func TestParsedTreeFind(t *testing.T) {
	names := []struct {
		name string
		dir  bool
	}{{"zz", false}, {"foo", true}, {"foo.txt", false}, {"foo-bar", false}, {"foo.d", true}, {"a", false}}
	var entries []rawEntry
	for i, n := range names {
		mode := filemode.Regular
		if n.dir {
			mode = filemode.Dir
		}
		entries = append(entries, rawEntry{name: []byte(n.name), mode: mode, hash: plumbing.Hash{byte(i + 1)}})
	}
	slices.SortFunc(entries, compareEntries)
	tb := treeBuilder{s: memory.NewStorage(), trees: newTreeCache()}
	tb.trees.begin()
	h, err := tb.writeTree(entries, plumbing.ZeroHash)
	require.NoError(t, err)
	sorted, ok := tb.trees.next[h]
	require.True(t, ok)
	raw := slices.Clone(sorted.content.bytes())
	// The same entries, in the order they were given: not Git's.
	var unsortedRaw []byte
	for _, n := range names {
		e := entries[slices.IndexFunc(entries, func(e rawEntry) bool { return string(e.name) == n.name })]
		unsortedRaw = appendMode(unsortedRaw, e.mode)
		unsortedRaw = append(unsortedRaw, ' ')
		unsortedRaw = append(unsortedRaw, n.name...)
		unsortedRaw = append(unsortedRaw, 0)
		unsortedRaw = append(unsortedRaw, e.hash[:]...)
	}
	for _, content := range [][]byte{raw, unsortedRaw} {
		tree, err := parseTree(plumbing.ZeroHash, content)
		require.NoError(t, err)
		for i, n := range names {
			j := tree.find(n.name)
			require.GreaterOrEqual(t, j, 0, n.name)
			require.Equal(t, n.name, string(tree.ents[j].name))
			require.Equal(t, plumbing.Hash{byte(i + 1)}, tree.hashAt(j), n.name)
		}
		for _, missing := range []string{"", "fo", "foo.", "foo/", "z", "zzz", "b"} {
			require.Equal(t, -1, tree.find(missing), missing)
		}
	}
}
