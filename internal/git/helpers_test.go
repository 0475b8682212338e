package git

import (
	"context"
	"fmt"
	"github.com/kubescribe/kubescribe/internal/testlog"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubescribe/kubescribe/internal/gittest"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/watch"
)

var (
	configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	namespaces = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	deploys    = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	tenants    = types.NamespacedName{Namespace: "kubescribe", Name: "tenants"}
	otherTgt   = types.NamespacedName{Namespace: "kubescribe", Name: "other"}
	observedAt = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	fixedNow   = time.Date(2026, 3, 4, 6, 0, 0, 0, time.UTC)
)

func runGit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	return gittest.Run(t, dir, args...)
}

// newBareRemote creates a bare repository and returns its directory and file:// URL.
func newBareRemote(t testing.TB) (string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "remote.git")
	runGit(t, "", "init", "--bare", "-q", dir)
	servePartialClones(t, dir)
	return dir, "file://" + dir
}

// servePartialClones configures a bare repository as servers that support partial clone are
// (GitHub, GitLab): fetches may filter out blobs, and ask for objects by id.
func servePartialClones(t testing.TB, gitDir string) {
	t.Helper()
	runGit(t, "", "--git-dir="+gitDir, "config", "uploadpack.allowFilter", "true")
	runGit(t, "", "--git-dir="+gitDir, "config", "uploadpack.allowAnySHA1InWant", "true")
}

// gitLog returns `git log --format=<format>` of branch in the bare repository, newest first.
func gitLog(t testing.TB, gitDir, branch, format string) []string {
	t.Helper()
	out := runGit(t, "", "--git-dir="+gitDir, "log", "--format="+format, branch, "--")
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// gitFiles lists the files of branch.
func gitFiles(t testing.TB, gitDir, branch string) []string {
	t.Helper()
	out := runGit(t, "", "--git-dir="+gitDir, "ls-tree", "-r", "--name-only", branch)
	if out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}

// gitShow returns the content of path on branch.
func gitShow(t testing.TB, gitDir, branch, path string) string {
	t.Helper()
	return runGit(t, "", "--git-dir="+gitDir, "show", branch+":"+path)
}

// pushCommitFromClone clones url, writes file in it and pushes branch, as another writer would.
func pushCommitFromClone(t testing.TB, url, branch, file, content string) {
	t.Helper()
	bobCommits(t, url, branch, "manual edit", func(dir string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, file)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644))
		runGit(t, dir, "add", file)
	})
}

// removeFromClone clones url, removes file and pushes branch as bob, with message.
func removeFromClone(t testing.TB, url, branch, file, message string) {
	t.Helper()
	bobCommits(t, url, branch, message, func(dir string) { runGit(t, dir, "rm", "-q", file) })
}

// bobCommits clones branch of url, lets edit change the clone, and commits and pushes that as
// bob, another writer.
func bobCommits(t testing.TB, url, branch, message string, edit func(dir string)) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "clone")
	runGit(t, "", "clone", "-q", "--branch", branch, url, dir)
	edit(dir)
	runGit(t, dir, "-c", "user.name=bob", "-c", "user.email=bob@example.com", "commit", "-q", "-m", message)
	runGit(t, dir, "push", "-q", "origin", branch)
}

func manifest(kind, ns, name, data string) []byte {
	meta := "  name: " + name + "\n"
	if ns != "" {
		meta += "  namespace: " + ns + "\n"
	}
	return []byte(fmt.Sprintf("apiVersion: v1\nkind: %s\nmetadata:\n%sdata:\n  key: %s\n", kind, meta, data))
}

// cmChange is a ConfigMap change on the "tenants" target.
func cmChange(op watch.Op, ns, name, data string) watch.Change {
	c := watch.Change{
		Cluster:         "prod",
		Target:          tenants,
		GVR:             configMaps,
		Namespace:       ns,
		Name:            name,
		UID:             "uid-" + name,
		ResourceVersion: "100",
		Op:              op,
		Observed:        observedAt,
	}
	if op != watch.OpDelete {
		c.Manifest = manifest("ConfigMap", ns, name, data)
	}
	return c
}

// by attributes c to a resolved user.
func by(user, auditID string, c watch.Change) attribution.AttributedChange {
	return attribution.AttributedChange{Change: c, Author: attribution.Author{
		Identity: audit.Identity{Username: user}, Resolved: true, AuditID: auditID, Verb: "update",
	}}
}

func unresolved(c watch.Change) attribution.AttributedChange {
	return attribution.AttributedChange{Change: c, Author: attribution.Author{
		Identity: audit.Identity{Username: attribution.UnresolvedUsername},
	}}
}

// pushLog records OnPushed calls.
type pushLog struct {
	mu      sync.Mutex
	results []PushResult
}

func (p *pushLog) record(r PushResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.results = append(p.results, r)
}

// settled returns the changes OnPushed reported as settled, in order.
func (p *pushLog) settled() []attribution.AttributedChange {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []attribution.AttributedChange
	for _, r := range p.results {
		out = append(out, r.Settled...)
	}
	return out
}

func (p *pushLog) commits() []CommitInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []CommitInfo
	for _, r := range p.results {
		out = append(out, r.Commits...)
	}
	return out
}

type syncBuffer = testlog.Buffer

type testWorker struct {
	*Worker
	pushes *pushLog
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error

	failMu sync.Mutex
	fails  []error         // OnFailed calls
	asked  []ReplayRequest // OnReplay calls
}

// replays returns the requests OnReplay received.
func (tw *testWorker) replays() []ReplayRequest {
	tw.failMu.Lock()
	defer tw.failMu.Unlock()
	return append([]ReplayRequest(nil), tw.asked...)
}

// failures returns the errors OnFailed received.
func (tw *testWorker) failures() []error {
	tw.failMu.Lock()
	defer tw.failMu.Unlock()
	return append([]error(nil), tw.fails...)
}

func testOptions(url string) Options {
	return Options{
		URL:               url,
		Branch:            "main",
		Committer:         Signature{Name: "kubescribe", Email: "kubescribe@example.com"},
		CommitWindow:      time.Hour,
		AuthorEmailDomain: "users.example.com",
		Now:               func() time.Time { return fixedNow },
	}
}

// startPushed starts a worker with a 10ms commit window on a new bare repository (adjust, when
// not nil, changes its options first) and has it push alice's creates of the ConfigMaps
// demo/<name> into folder (audit IDs a1, a2, ...).
func startPushed(t *testing.T, folder string, adjust func(*Options), names ...string) (gitDir, url string, tw *testWorker) {
	t.Helper()
	gitDir, url = newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	if adjust != nil {
		adjust(&opts)
	}
	tw = startWorker(t, opts)
	for i, name := range names {
		tw.Submit(folder, by("alice", fmt.Sprintf("a%d", i+1), cmChange(watch.OpCreate, "demo", name, "1")))
	}
	tw.waitPushed(t)
	return gitDir, url, tw
}

// startWorker creates and runs a worker; stop it with tw.stop (or at cleanup).
func startWorker(t testing.TB, opts Options) *testWorker {
	t.Helper()
	tw := newTestWorker(t, opts)
	tw.start(t)
	return tw
}

// newTestWorker creates a worker without running it, so that a test can set its seams (which the
// Run goroutine reads) and submit changes before it runs; run it with tw.start.
func newTestWorker(t testing.TB, opts Options) *testWorker {
	t.Helper()
	tw := &testWorker{pushes: &pushLog{}, logs: &syncBuffer{}, done: make(chan error, 1)}
	opts.OnPushed = tw.pushes.record
	opts.OnFailed = func(err error) {
		tw.failMu.Lock()
		defer tw.failMu.Unlock()
		tw.fails = append(tw.fails, err)
	}
	opts.OnReplay = func(req ReplayRequest) {
		tw.failMu.Lock()
		defer tw.failMu.Unlock()
		tw.asked = append(tw.asked, req)
	}
	opts.Logger = slog.New(slog.NewTextHandler(tw.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w, err := NewWorker(opts)
	require.NoError(t, err)
	w.backoff = func(int) time.Duration { return 20 * time.Millisecond }
	w.finalTimeout = 10 * time.Second
	tw.Worker = w
	return tw
}

// start runs the worker; stop it with tw.stop (or at cleanup).
func (tw *testWorker) start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tw.cancel = cancel
	go func() { tw.done <- tw.Run(ctx) }()
	t.Cleanup(func() {
		_ = tw.stop(t)
		if t.Failed() {
			t.Logf("worker logs:\n%s", tw.logs.String())
		}
	})
}

// stop cancels Run and returns its error; later calls return nil.
func (tw *testWorker) stop(t testing.TB) error {
	t.Helper()
	tw.cancel()
	select {
	case err, ok := <-tw.done:
		if !ok {
			return nil
		}
		close(tw.done)
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop")
		return nil
	}
}

// waitPushed waits until nothing is pending and at least one push happened.
func (tw *testWorker) waitPushed(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		st := tw.Status()
		return st.Pending == 0 && !st.LastPush.IsZero()
	}, 20*time.Second, 10*time.Millisecond, "worker did not push")
}
