package git

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/watch"
)

// newHTTPSRemote serves a bare repository through `git http-backend` over TLS, behind basic auth.
// It returns the repository directory, its URL and the server's CA certificate (PEM).
func newHTTPSRemote(t *testing.T, user, password string) (string, string, []byte) {
	t.Helper()
	gitDir, url, ca, _ := newCountingHTTPSRemote(t, user, password)
	return gitDir, url, ca
}

// newCountingHTTPSRemote is newHTTPSRemote that also counts the connections clients open.
func newCountingHTTPSRemote(t *testing.T, user, password string) (string, string, []byte, *atomic.Int64) {
	t.Helper()
	root := t.TempDir()
	gitDir := filepath.Join(root, "repo.git")
	runGit(t, "", "init", "--bare", "-q", gitDir)
	runGit(t, "", "--git-dir="+gitDir, "config", "http.receivepack", "true")
	servePartialClones(t, gitDir)
	backend := &cgi.Handler{
		Path:       filepath.Join(runGit(t, "", "--exec-path"), "git-http-backend"),
		Env:        []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
		InheritEnv: []string{"PATH", "HOME"},
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // TLS handshake failures are expected in tests
	conns := new(atomic.Int64)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return gitDir, srv.URL + "/repo.git", ca, conns
}

// A worker keeps its HTTPS connections alive from one remote operation to the next: go-git's
// default client, given a CA bundle, opened (and left idle) a connection per operation.
func TestHTTPSReusesConnections(t *testing.T) {
	gitDir, url, ca, conns := newCountingHTTPSRemote(t, "u", "p")
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	opts.Credentials = Credentials{Username: "u", Password: "p", CABundle: ca}
	tw := startWorker(t, opts)
	const pushes = 5
	for i := range pushes {
		tw.Submit("", by("alice", fmt.Sprint("a", i), cmChange(watch.OpCreate, "demo", fmt.Sprint("cfg-", i), "1")))
		tw.waitPushed(t)
	}
	require.NoError(t, tw.stop(t))
	require.Len(t, gitLog(t, gitDir, "main", "%s"), pushes)
	// A clone and five pushes opened six connections with go-git's default client; one serves
	// them now, or two if the server closed one in between.
	require.LessOrEqual(t, conns.Load(), int64(2), "connections opened")
}

func TestHTTPSCredentials(t *testing.T) {
	const user, password = "robot-user-name", "s3cr3t-token-value"
	tests := []struct {
		name        string
		password    string
		wantPushed  bool
		wantErrText string
	}{
		{name: "valid credentials push over TLS with the CA bundle", password: password, wantPushed: true},
		{name: "wrong password fails without leaking it", password: "wrong-s3cr3t-value", wantErrText: "authentication"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gitDir, url, ca := newHTTPSRemote(t, user, password)
			opts := testOptions(url)
			opts.CommitWindow = 10 * time.Millisecond
			opts.Credentials = Credentials{Username: user, Password: tt.password, CABundle: ca}
			tw := startWorker(t, opts)
			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))

			if tt.wantPushed {
				tw.waitPushed(t)
				require.NoError(t, tw.stop(t))
				require.Equal(t, []string{"alice|create configmaps demo/cfg"}, gitLog(t, gitDir, "main", "%an|%s"))
			} else {
				require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)
				err := tw.stop(t)
				require.Error(t, err)
				require.ErrorContains(t, tw.Status().LastError, tt.wantErrText)
				for _, s := range []string{err.Error(), tw.Status().LastError.Error()} {
					require.NotContains(t, s, tt.password)
					require.NotContains(t, s, user)
				}
			}
			logs := tw.logs.String()
			require.NotEmpty(t, logs)
			require.NotContains(t, logs, tt.password)
			require.NotContains(t, logs, user)
		})
	}
}

func TestHTTPSWithoutCABundleFails(t *testing.T) {
	_, url, _ := newHTTPSRemote(t, "u", "p")
	opts := testOptions(url)
	opts.Credentials = Credentials{Username: "u", Password: "p"}
	tw := startWorker(t, opts)
	require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)
	require.ErrorContains(t, tw.Status().LastError, "certificate")
}

func TestRedact(t *testing.T) {
	w, err := NewWorker(func() Options {
		o := testOptions("https://example.com/r.git")
		o.Credentials = Credentials{Username: "u", Password: "pa ss/word"}
		return o
	}())
	require.NoError(t, err)

	inner := errors.New("dial https://u:pa%20ss%2Fword@example.com failed: pa ss/word")
	red := w.redact(fmt.Errorf("push: %w", inner))
	require.Equal(t, "push: dial https://u:<redacted>@example.com failed: <redacted>", red.Error())
	require.NoError(t, errors.Unwrap(red), "a redacted error does not expose the original")

	clean := fmt.Errorf("push: %w", errors.ErrUnsupported)
	require.Same(t, clean, w.redact(clean), "errors without the secret keep their chain")
}

// Rotating the credentials of a running worker keeps what it holds: the change that could not
// be pushed with the revoked token is pushed with the new one, and neither token is ever shown.
func TestSetCredentialsKeepsPendingChanges(t *testing.T) {
	const user, oldPassword, newPassword = "robot", "revoked-token-value", "fresh-token-value"
	gitDir, url, ca := newHTTPSRemote(t, user, newPassword)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Credentials = Credentials{Username: user, Password: oldPassword, CABundle: ca}
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)

	require.Error(t, tw.SetCredentials(Credentials{Username: user, Password: newPassword, CABundle: []byte("not PEM")}))
	require.NoError(t, tw.SetCredentials(Credentials{Username: user, Password: newPassword, CABundle: ca}))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	require.Equal(t, []string{"alice|create configmaps demo/cfg"}, gitLog(t, gitDir, "main", "%an|%s"))
	logs := tw.logs.String()
	require.NotContains(t, logs, oldPassword)
	require.NotContains(t, logs, newPassword)
	for _, err := range tw.failures() {
		require.NotContains(t, err.Error(), oldPassword)
	}
}

// Over HTTPS too, a push refused because someone else pushed is followed by a shallow fetch of
// what the worker lacks and a rebuild on the new tip; the packs the worker sends are thin and
// complete (git fsck passes).
func TestHTTPSNonFastForward(t *testing.T) {
	const user, password = "robot", "token-value"
	gitDir, url, ca := newHTTPSRemote(t, user, password)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Credentials = Credentials{Username: user, Password: password, CABundle: ca}
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	waitFor(t, "first push", func() bool { return len(tw.pushes.commits()) == 1 })

	pushCommitFromClone(t, "file://"+gitDir, "main", "demo/core/configmaps/bob.yaml", "bob\n")
	tw.Submit("", by("alice", "a2", cmChange(watch.OpUpdate, "demo", "one", "2")))
	waitFor(t, "second push", func() bool { return len(tw.pushes.commits()) == 2 && tw.Status().Pending == 0 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"alice|update configmaps demo/one", "bob|manual edit", "alice|create configmaps demo/one"},
		gitLog(t, gitDir, "main", "%an|%s"))
	require.Equal(t, "bob", gitShow(t, gitDir, "main", "demo/core/configmaps/bob.yaml"))
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/one.yaml"), "key: 2")
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
	require.Contains(t, tw.logs.String(), "remote branch moved; rebuilding unpushed commits on its tip")
	require.NotContains(t, tw.logs.String(), password)
}
