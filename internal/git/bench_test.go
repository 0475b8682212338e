package git

import (
	"fmt"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// BenchmarkCommit measures building one commit of one changed object in repositories of
// different sizes. Objects are spread like a cluster's: 100 per namespace. The cost should stay
// flat as the repository grows, because only the trees on the changed path are rewritten.
// Compare the sub-benchmarks side by side; there is no timing assertion.
func BenchmarkCommit(b *testing.B) {
	for _, files := range []int{100, 10_000} {
		name := fmt.Sprintf("files=%d", files)
		if files == 100 {
			name = "baseline-" + name // make bench reports the larger repository as a ratio to it
		}
		b.Run(name, func(b *testing.B) {
			tb := treeBuilder{s: memory.NewStorage()}
			committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
			self := Signature{Name: "kubescribe", Email: "k@example.com"}
			seed := make([]attribution.AttributedChange, 0, files)
			for i := range files {
				ns := fmt.Sprintf("ns-%03d", i/100)
				seed = append(seed, by("alice", "a", cmChange(watch.OpCreate, ns, fmt.Sprintf("cm-%03d", i%100), "seed")))
			}
			tip, ok, err := tb.materialize(newPlan("clusters/prod", seed, self, "users.example.com", fixedNow), plumbing.ZeroHash, committer)
			require.NoError(b, err)
			require.True(b, ok)

			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				c := by("alice", "a", cmChange(watch.OpUpdate, "ns-000", "cm-042", fmt.Sprintf("v%d", i)))
				p := newPlan("clusters/prod", []attribution.AttributedChange{c}, self, "users.example.com", fixedNow)
				tip, ok, err = tb.materialize(p, tip, committer)
				if err != nil || !ok {
					b.Fatalf("commit %d: ok=%v err=%v", i, ok, err)
				}
			}
		})
	}
}
