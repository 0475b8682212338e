package git

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/watch"
)

// TestPushOfTreesThatComeBack: two commits pushed together, the second undoing the first (a
// ConfigMap deleted and created again as it was), so its trees are the ones the first commit
// replaced, which the remote holds. The pack must not send them as deltas against the first commit's
// trees, whose own deltas are against them: the server's index-pack would find a cycle it
// completes from the repository and die (REF_DELTA ... already resolved (duplicate base)).
func TestPushOfTreesThatComeBack(t *testing.T) {
	// Over git http-backend: git's own receive-pack and index-pack read the pack.
	gitDir, url, ca := newHTTPSRemote(t, "u", "p")
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Credentials = Credentials{Username: "u", Password: "p", CABundle: ca}
	tw := newTestWorker(t, opts)
	var held atomic.Bool
	tw.pushFn = func(ctx context.Context) error {
		if held.Load() {
			return errors.New("held by the test")
		}
		return tw.pushOnce(ctx)
	}
	tw.start(t)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "flip", "1")))
	for i := range 20 { // a directory large enough that its trees go as deltas
		tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", fmt.Sprintf("other-%02d", i), "1")))
	}
	tw.waitPushed(t)

	held.Store(true)
	committed := func(n int) func() bool {
		return func() bool { return strings.Count(tw.logs.String(), "msg=committed") == n }
	}
	tw.Submit("", by("bob", "b1", cmChange(watch.OpDelete, "demo", "flip", "")))
	require.Eventually(t, committed(2), 20*time.Second, 10*time.Millisecond)
	tw.Submit("", by("carol", "c1", cmChange(watch.OpCreate, "demo", "flip", "1")))
	require.Eventually(t, committed(3), 20*time.Second, 10*time.Millisecond)
	held.Store(false)

	require.Eventually(t, func() bool {
		st := tw.Status()
		return st.Pending == 0 && st.LastError == nil
	}, 20*time.Second, 10*time.Millisecond, "the two commits are pushed: %v\n%s", tw.Status().LastError, tw.logs.String())
	require.Len(t, gitLog(t, gitDir, "main", "%an"), 3)
	require.Contains(t, gitFiles(t, gitDir, "main"), "demo/core/configmaps/flip.yaml")
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
}

// TestBuildPackSendsNoDeltaCycle: objects X and Y each recorded with the other as its base (Y
// came back after X replaced it): X, whose base comes later in the pack, is sent whole, and Y
// as a delta against X, so the pack holds no cycle for index-pack to trip on.
func TestBuildPackSendsNoDeltaCycle(t *testing.T) {
	s := memory.NewStorage()
	content := bytes.Repeat([]byte("100644 settings.yaml\x00abcdefghijklmnopqrst"), 40)
	y, err := s.SetEncodedObject(newRawObject(plumbing.TreeObject, content))
	require.NoError(t, err)
	x, err := s.SetEncodedObject(newRawObject(plumbing.TreeObject, append(bytes.Clone(content), []byte("100644 z.yaml\x00abcdefghijklmnopqrst")...)))
	require.NoError(t, err)
	pack, err := buildPack(s, []packObject{{hash: x, base: y}, {hash: y, base: x}}, true)
	require.NoError(t, err)

	sc := packfile.NewScanner(bytes.NewReader(pack))
	_, n, err := sc.Header()
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	var types []plumbing.ObjectType
	var bases []plumbing.Hash
	for range n {
		h, err := sc.NextObjectHeader()
		require.NoError(t, err)
		types, bases = append(types, h.Type), append(bases, h.Reference)
		_, _, err = sc.NextObject(io.Discard)
		require.NoError(t, err)
	}
	require.Equal(t, plumbing.TreeObject, types[0], "X is sent whole: its base comes later in the pack")
	require.Equal(t, plumbing.REFDeltaObject, types[1], "Y is a delta against X, which precedes it")
	require.Equal(t, x, bases[1])
}
