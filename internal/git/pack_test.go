package git

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/stretchr/testify/require"
)

// patchDelta's deltas, applied by go-git's reader to the base, give the patched content: for
// hashes at the start, the end, next to each other, and runs longer than one copy instruction.
func TestPatchDeltaAppliesToTheBase(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tt := range []struct {
		name    string
		size    int
		patched []int
	}{
		{name: "one in the middle", size: 400, patched: []int{200}},
		{name: "first and last", size: 100, patched: []int{0, 80}},
		{name: "adjacent", size: 100, patched: []int{10, 30}},
		{name: "long runs", size: 3*maxDeltaCopy + 77, patched: []int{5, maxDeltaCopy + 3, 2*maxDeltaCopy + 40}},
		{name: "exactly one copy", size: maxDeltaCopy + hashSize, patched: []int{maxDeltaCopy}},
		{name: "nothing", size: 64, patched: []int{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base := make([]byte, tt.size)
			for i := range base {
				base[i] = byte(rng.IntN(256))
			}
			content := bytes.Clone(base)
			for _, off := range tt.patched {
				for i := range hashSize {
					content[off+i] = byte(rng.IntN(256))
				}
			}
			got, err := packfile.PatchDelta(base, patchDelta(flatContent(content), tt.patched))
			require.NoError(t, err)
			require.Equal(t, content, got)
			// The same content as pages, a patched tree's.
			var patches []hashPatch
			for _, off := range tt.patched {
				patches = append(patches, hashPatch{off: off, h: plumbing.Hash(content[off : off+hashSize])})
			}
			paged := flatContent(base).patched(patches)
			require.Equal(t, content, paged.bytes())
			got, err = packfile.PatchDelta(base, patchDelta(paged, tt.patched))
			require.NoError(t, err)
			require.Equal(t, content, got)
		})
	}
}
