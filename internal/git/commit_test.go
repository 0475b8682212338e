package git

import (
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func TestAuthorSignature(t *testing.T) {
	tests := []struct {
		name      string
		author    attribution.Author
		wantName  string
		wantEmail string
	}{
		{
			name:      "plain username",
			author:    attribution.Author{Identity: audit.Identity{Username: "alice"}, Resolved: true},
			wantName:  "alice",
			wantEmail: "alice@users.example.com",
		},
		{
			name:      "username is an email",
			author:    attribution.Author{Identity: audit.Identity{Username: "alice@corp.example"}, Resolved: true},
			wantName:  "alice@corp.example",
			wantEmail: "alice@corp.example",
		},
		{
			name:      "service account",
			author:    attribution.Author{Identity: audit.Identity{Username: "system:serviceaccount:ci:deployer"}, Resolved: true},
			wantName:  "system:serviceaccount:ci:deployer",
			wantEmail: "system:serviceaccount:ci:deployer@users.example.com",
		},
		{
			name:      "characters a signature cannot hold",
			author:    attribution.Author{Identity: audit.Identity{Username: "<mal>lory\nx"}, Resolved: true},
			wantName:  "mallory" + "x",
			wantEmail: "malloryx@users.example.com",
		},
		{
			name:      "unresolved",
			author:    attribution.Author{Identity: audit.Identity{Username: attribution.UnresolvedUsername}},
			wantName:  "unknown (attribution unresolved)",
			wantEmail: "unknown@users.example.com",
		},
		{
			name:      "unresolved with a stray username",
			author:    attribution.Author{Identity: audit.Identity{Username: "alice"}},
			wantName:  "unknown (attribution unresolved)",
			wantEmail: "unknown@users.example.com",
		},
		{
			name:      "resolved but empty",
			author:    attribution.Author{Resolved: true},
			wantName:  "unknown (attribution unresolved)",
			wantEmail: "unknown@users.example.com",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sig := authorSignature(tt.author, "users.example.com")
			require.Equal(t, tt.wantName, sig.Name)
			require.Equal(t, tt.wantEmail, sig.Email)
		})
	}
}

func TestCommitMessage(t *testing.T) {
	ns := by("alice", "", cmChange(watch.OpCreate, "", "team-a", ""))
	ns.GVR = namespaces
	tests := []struct {
		name     string
		changes  []attribution.AttributedChange
		snapshot bool
		want     string
	}{
		{
			name:    "one cluster-scoped change without audit id",
			changes: []attribution.AttributedChange{ns},
			want: "create namespaces team-a\n\n" +
				"create core/namespaces team-a resourceVersion=100 uid=uid-team-a\n\n" +
				"Kubescribe-User: alice\n" +
				"Kubescribe-Attribution: resolved\n" +
				"Kubescribe-Cluster: prod\n",
		},
		{
			name:     "one snapshot object",
			changes:  []attribution.AttributedChange{unresolved(cmChange(watch.OpCreate, "demo", "cfg", "1"))},
			snapshot: true,
			want: "Snapshot of configmaps demo/cfg\n\n" +
				"create core/configmaps demo/cfg resourceVersion=100 uid=uid-cfg\n\n" +
				"Kubescribe-Attribution: snapshot\n" +
				"Kubescribe-Cluster: prod\n",
		},
		{
			name: "clusters are listed once each",
			changes: func() []attribution.AttributedChange {
				a := unresolved(cmChange(watch.OpDelete, "demo", "a", ""))
				b := unresolved(cmChange(watch.OpDelete, "demo", "b", ""))
				b.Cluster = "staging"
				c := unresolved(cmChange(watch.OpDelete, "demo", "c", ""))
				return []attribution.AttributedChange{a, b, c}
			}(),
			want: "3 changes by unknown (attribution unresolved)\n\n" +
				"delete core/configmaps demo/a resourceVersion=100 uid=uid-a\n" +
				"delete core/configmaps demo/b resourceVersion=100 uid=uid-b\n" +
				"delete core/configmaps demo/c resourceVersion=100 uid=uid-c\n\n" +
				"Kubescribe-User: unknown (attribution unresolved)\n" +
				"Kubescribe-Attribution: unresolved\n" +
				"Kubescribe-Cluster: prod\n" +
				"Kubescribe-Cluster: staging\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, commitMessage(tt.changes, tt.snapshot))
		})
	}
}

// TestTreeBuilderReusesUntouchedSubtrees checks that a commit rewrites only the trees on the
// changed path.
func TestTreeBuilderReusesUntouchedSubtrees(t *testing.T) {
	tb := treeBuilder{s: memory.NewStorage()}
	committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
	first := newPlan("", []attribution.AttributedChange{
		by("alice", "a", cmChange(watch.OpCreate, "a", "x", "1")),
		by("alice", "a", cmChange(watch.OpCreate, "b", "y", "1")),
	}, Signature{Name: "k", Email: "k@example.com"}, "users.example.com", fixedNow)
	c1, ok, err := tb.materialize(first, plumbing.ZeroHash, committer)
	require.NoError(t, err)
	require.True(t, ok)

	second := newPlan("", []attribution.AttributedChange{
		by("alice", "a", cmChange(watch.OpUpdate, "a", "x", "2")),
	}, Signature{Name: "k", Email: "k@example.com"}, "users.example.com", fixedNow)
	c2, ok, err := tb.materialize(second, c1, committer)
	require.NoError(t, err)
	require.True(t, ok)

	subtree := func(commit plumbing.Hash, name string) plumbing.Hash {
		c, err := object.GetCommit(tb.s, commit)
		require.NoError(t, err)
		tree, err := c.Tree()
		require.NoError(t, err)
		e, err := tree.FindEntry(name)
		require.NoError(t, err)
		return e.Hash
	}
	require.Equal(t, subtree(c1, "b"), subtree(c2, "b"), "untouched subtree keeps its hash")
	require.NotEqual(t, subtree(c1, "a"), subtree(c2, "a"))

	// Deleting everything leaves an empty tree, which is still a commit.
	third := newPlan("", []attribution.AttributedChange{
		by("bob", "b", cmChange(watch.OpDelete, "a", "x", "")),
		by("bob", "b", cmChange(watch.OpDelete, "b", "y", "")),
	}, Signature{Name: "k", Email: "k@example.com"}, "users.example.com", fixedNow)
	c3, ok, err := tb.materialize(third, c2, committer)
	require.NoError(t, err)
	require.True(t, ok)
	c, err := object.GetCommit(tb.s, c3)
	require.NoError(t, err)
	tree, err := c.Tree()
	require.NoError(t, err)
	require.Empty(t, tree.Entries)
}
