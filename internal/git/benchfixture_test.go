package git

import (
	"bufio"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Benchmark fixtures: bare repositories of n files laid out as kubescribe writes them (100
// ConfigMaps per namespace), with history: one commit adding every file, then
// benchFixtureHistory commits changing one file each. They are written with `git fast-import`
// (one pack, a second or two for 100,000 files) and cached under the system temp directory
// across runs, keyed by their shape; delete $TMPDIR/kubescribe-bench-* to rebuild them.

const (
	benchFixtureVersion = "v1"
	benchFixtureHistory = 200
	// benchNamespace, benchName: the object every benchmark changes.
	benchNamespace = "ns-000"
	benchName      = "cm-042"
)

var benchFixtureMu sync.Mutex

func benchCacheDir(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(os.TempDir(), "kubescribe-bench-"+benchFixtureVersion)
	require.NoError(tb, os.MkdirAll(dir, 0o755))
	return dir
}

func benchPath(i int) string {
	return ObjectPath("", benchChange(i, "seed").Change)
}

func benchChange(i int, data string) attribution.AttributedChange {
	ns, name := fmt.Sprintf("ns-%03d", i/100), fmt.Sprintf("cm-%03d", i%100)
	op := watch.OpUpdate
	return by("alice", "a", cmChange(op, ns, name, data))
}

// benchFixture returns the directory of the cached bare fixture repository of files files.
func benchFixture(tb testing.TB, files int) string {
	tb.Helper()
	benchFixtureMu.Lock()
	defer benchFixtureMu.Unlock()
	dir := filepath.Join(benchCacheDir(tb), fmt.Sprintf("files-%d.git", files))
	if _, err := os.Stat(filepath.Join(dir, "kubescribe-fixture-complete")); err == nil {
		return dir
	}
	require.NoError(tb, os.RemoveAll(dir))
	tmp := dir + ".tmp"
	require.NoError(tb, os.RemoveAll(tmp))
	runGit(tb, "", "init", "--bare", "-q", "-b", "main", tmp)
	cmd := exec.Command("git", "--git-dir="+tmp, "fast-import", "--quiet")
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	cmd.Stderr = os.Stderr
	require.NoError(tb, cmd.Start())
	w := bufio.NewWriterSize(stdin, 1<<20)
	data := func(b []byte) {
		fmt.Fprintf(w, "data %d\n", len(b))
		_, _ = w.Write(b)
		_ = w.WriteByte('\n')
	}
	for i := range files {
		fmt.Fprintf(w, "blob\nmark :%d\n", i+1)
		data(benchChange(i, "seed").Manifest)
	}
	when := 1700000000
	fmt.Fprintf(w, "commit refs/heads/main\ncommitter seed <seed@example.com> %d +0000\n", when)
	data([]byte("seed\n"))
	for i := range files {
		fmt.Fprintf(w, "M 100644 :%d %s\n", i+1, benchPath(i))
	}
	for h := range benchFixtureHistory {
		when++
		i := (h * 7919) % files
		fmt.Fprintf(w, "commit refs/heads/main\ncommitter seed <seed@example.com> %d +0000\n", when)
		data([]byte(fmt.Sprintf("history %d\n", h)))
		fmt.Fprintf(w, "M 100644 inline %s\n", benchPath(i))
		data(benchChange(i, fmt.Sprintf("history-%d", h)).Manifest)
	}
	require.NoError(tb, w.Flush())
	require.NoError(tb, stdin.Close())
	require.NoError(tb, cmd.Wait())
	// What a hosted remote allows: partial clone filters, pushes over HTTP.
	runGit(tb, "", "--git-dir="+tmp, "config", "uploadpack.allowFilter", "true")
	runGit(tb, "", "--git-dir="+tmp, "config", "http.receivepack", "true")
	runGit(tb, "", "--git-dir="+tmp, "repack", "-adq")
	require.NoError(tb, os.WriteFile(filepath.Join(tmp, "kubescribe-fixture-complete"), nil, 0o644))
	require.NoError(tb, os.Rename(tmp, dir))
	return dir
}

// copyBare copies a bare repository into a fresh directory under root.
func copyBare(tb testing.TB, src, root, name string) string {
	tb.Helper()
	dst := filepath.Join(root, name)
	out, err := exec.Command("cp", "-a", src, dst).CombinedOutput()
	require.NoError(tb, err, "%s", out)
	return dst
}

// benchServer serves the bare repositories under root over HTTPS through `git http-backend`,
// as the worker meets a remote in production, and counts the request bytes clients send.
type benchServer struct {
	url    string // https://127.0.0.1:port
	ca     []byte
	caFile string
	sent   atomic.Int64
	// receiving is the time spent serving receive-pack requests (git http-backend running
	// git receive-pack: unpacking, the connectivity check, the ref update), in nanoseconds.
	receiving atomic.Int64
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func newBenchServer(tb testing.TB, root string) *benchServer {
	tb.Helper()
	backend := &cgi.Handler{
		Path:       filepath.Join(runGit(tb, "", "--exec-path"), "git-http-backend"),
		Env:        []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=bench"},
		InheritEnv: []string{"PATH", "HOME"},
	}
	s := &benchServer{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = countingBody{ReadCloser: r.Body, n: &s.sent}
		}
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/git-receive-pack") {
			start := time.Now()
			defer func() { s.receiving.Add(int64(time.Since(start))) }()
		}
		backend.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	tb.Cleanup(srv.Close)
	s.url = srv.URL
	s.ca = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	s.caFile = filepath.Join(tb.TempDir(), "ca.pem")
	require.NoError(tb, os.WriteFile(s.caFile, s.ca, 0o644))
	return s
}

// git runs the git CLI as a client of this server (trusting its CA).
func (s *benchServer) git(tb testing.TB, dir string, args ...string) {
	tb.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_SSL_CAINFO="+s.caFile)
	out, err := cmd.CombinedOutput()
	require.NoError(tb, err, "git %s: %s", strings.Join(args, " "), out)
}

// benchWorker is a worker driven step by step on the benchmark goroutine (no Run loop).
func benchWorker(tb testing.TB, url string, ca []byte) *Worker {
	tb.Helper()
	opts := testOptions(url)
	opts.Credentials = Credentials{CABundle: ca}
	opts.Logger = discardLogger()
	w, err := NewWorker(opts)
	require.NoError(tb, err)
	return w
}

// benchCommit builds one commit changing the benchmark object, as the worker does when a commit
// window closes.
func (w *Worker) benchCommit(i int) error {
	p := newPlan("", []attribution.AttributedChange{cmChangeAttributed(fmt.Sprintf("v%d", i))},
		w.opts.Committer, w.opts.AuthorEmailDomain, fixedNow)
	sha, ok, err := w.builder().materialize(p, w.localTip, w.committer())
	if err != nil || !ok {
		return fmt.Errorf("commit: ok=%v err=%w", ok, err)
	}
	w.committed(p, sha)
	w.gc.committed(w.store, sha, p.objects)
	w.plans = append(w.plans, p)
	w.setLocalTip(sha)
	return nil
}

// benchPush pushes the unpushed commits and records them delivered, as the worker does.
func (w *Worker) benchPush(ctx context.Context) error {
	if err := w.pushPlans(ctx, len(w.plans)); err != nil {
		return err
	}
	w.delivered(len(w.plans))
	w.compactIfDue()
	return nil
}

func cmChangeAttributed(data string) attribution.AttributedChange {
	return by("alice", "a", cmChange(watch.OpUpdate, benchNamespace, benchName, data))
}
