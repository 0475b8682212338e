package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/object"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// startForTest starts a control plane in a temporary directory, dumps its logs if the test
// fails and stops it at the end.
func startForTest(t *testing.T) *ControlPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	cp, err := Start(ctx, Options{Dir: t.TempDir(), Logf: t.Logf})
	require.NoError(t, err)
	t.Logf("Start took %s", time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			var b strings.Builder
			cp.DumpLogs(&b, 60)
			t.Log(b.String())
		}
		require.NoError(t, cp.Stop())
	})
	return cp
}

func TestControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, kube-apiserver and redis-server")
	}
	cp := startForTest(t)
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(cp.AdminConfig)

	t.Run("admin lists namespaces", func(t *testing.T) {
		list, err := admin.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		var names []string
		for _, ns := range list.Items {
			names = append(names, ns.Name)
		}
		require.Contains(t, names, "default")
		require.Contains(t, names, "kube-system")
	})

	t.Run("kubeconfig files authenticate their user", func(t *testing.T) {
		for _, user := range Users {
			cfg, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath(user))
			require.NoError(t, err)
			review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().
				Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
			require.NoError(t, err)
			require.Equal(t, user, review.Status.UserInfo.Username)
			require.Contains(t, review.Status.UserInfo.Groups, "system:authenticated")
			if user == "admin" {
				require.Contains(t, review.Status.UserInfo.Groups, "system:masters")
			} else {
				require.NotContains(t, review.Status.UserInfo.Groups, "system:masters")
			}
		}
	})

	t.Run("alice needs a Role to create a ConfigMap", func(t *testing.T) {
		const ns = "rbac-test"
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
		alice := kubernetes.NewForConfigOrDie(cp.UserConfig("alice"))
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "by-alice"}, Data: map[string]string{"k": "v"}}
		_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		require.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)

		_, err = admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "configmap-writer"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get"}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice-configmap-writer"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmap-writer"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		// The RBAC authorizer reads from an informer cache: allow it a moment.
		require.Eventually(t, func() bool {
			_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
			return err == nil
		}, 10*time.Second, 100*time.Millisecond, "alice still cannot create: %v", err)
		bob := kubernetes.NewForConfigOrDie(cp.UserConfig("bob"))
		_, err = bob.CoreV1().ConfigMaps(ns).Get(ctx, "by-alice", metav1.GetOptions{})
		require.True(t, apierrors.IsForbidden(err), "want Forbidden for bob, got %v", err)
	})

	t.Run("a watch-list client gets the initial state streamed", func(t *testing.T) {
		// client-go's reflectors ask for this first (WatchListClient, on by default). The
		// apiserver can serve it only when its etcd answers watch progress requests (3.4.31,
		// 3.5.13 and later); on Debian's etcd 3.4 the stream ends in an internal error.
		const ns = "watch-list"
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
		want := map[string]bool{}
		for _, name := range []string{"one", "two", "three"} {
			_, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			require.NoError(t, err)
			want[name] = true
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		w, err := admin.CoreV1().ConfigMaps(ns).Watch(wctx, metav1.ListOptions{
			SendInitialEvents:    ptr.To(true),
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
			AllowWatchBookmarks:  true,
		})
		require.NoError(t, err)
		defer w.Stop()
		got := map[string]bool{}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added:
				got[ev.Object.(*corev1.ConfigMap).Name] = true
			case watch.Bookmark:
				if ev.Object.(*corev1.ConfigMap).Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					// No controller-manager runs, so nothing else (kube-root-ca.crt) is in ns.
					require.Equal(t, want, got, "initial events before the %s bookmark", metav1.InitialEventsAnnotationKey)
					return
				}
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				t.Fatalf("the watch-list stream failed: %s: %v", apierrors.ReasonForError(err), err)
			default:
				t.Fatalf("%s event before the %s bookmark", ev.Type, metav1.InitialEventsAnnotationKey)
			}
		}
		t.Fatalf("the watch ended without the %s bookmark (initial events: %v)", metav1.InitialEventsAnnotationKey, got)
	})

	t.Run("apiserver sends audit events to the audit endpoint", func(t *testing.T) {
		got := make(chan *http.Request, 100)
		srv := serveAudit(t, cp, func(r *http.Request, body []byte) {
			if bytes.Contains(body, []byte(`"audit-probe"`)) {
				got <- r
			}
		})
		defer srv.Close()
		// Events of writes made while nothing listened may still be in retry; a fresh write
		// is certain to reach us within the 1s batch wait.
		_, err := admin.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "audit-probe"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		select {
		case r := <-got:
			require.Equal(t, "/audit/local", r.URL.Path)
			require.Equal(t, "kube-apiserver", r.TLS.PeerCertificates[0].Subject.CommonName)
			require.Empty(t, r.Header.Get("Authorization"))
		case <-time.After(30 * time.Second):
			t.Fatal("no audit event for the probe ConfigMap within 30s")
		}
		token, err := os.ReadFile(cp.Audit.TokenFile)
		require.NoError(t, err)
		require.Equal(t, cp.Audit.Token+"\n"+cp.Audit.TenantToken+" "+cp.Audit.TenantRoute, strings.TrimSpace(string(token)))
	})

	t.Run("git server accepts pushes with the credentials only", func(t *testing.T) {
		testGitServer(t, cp)
	})

	t.Run("redis answers and can be restarted", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: cp.RedisAddr, MaxRetries: -1})
		defer rdb.Close()
		require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
		require.Equal(t, "PONG", rdb.Ping(ctx).Val())

		require.NoError(t, cp.StopRedis())
		require.Error(t, rdb.Ping(ctx).Err())
		require.NoError(t, cp.StartRedis())
		require.NoError(t, cp.StartRedis(), "StartRedis on a running Redis is a no-op")
		require.Eventually(t, func() bool { return rdb.Ping(ctx).Err() == nil }, 10*time.Second, 100*time.Millisecond)
		require.ErrorIs(t, rdb.Get(ctx, "k").Err(), redis.Nil, "a restarted Redis starts empty")
	})

	t.Run("Stop leaves no process behind", func(t *testing.T) {
		procs := []*process{cp.api, cp.etcd, cp.redis}
		require.NoError(t, cp.Stop())
		require.NoError(t, cp.Stop(), "Stop is idempotent")
		for _, p := range procs {
			require.True(t, p.exited(), "%s still running", p.name)
			require.ErrorIs(t, syscall.Kill(p.pid(), 0), syscall.ESRCH, "%s pid %d still exists", p.name, p.pid())
			require.ErrorIs(t, syscall.Kill(-p.pid(), 0), syscall.ESRCH, "%s process group %d still exists", p.name, p.pid())
		}
		require.Empty(t, childProcesses(t), "child processes left behind")
		_, err := net.DialTimeout("tcp", cp.Git.addr, time.Second)
		require.Error(t, err, "git server still listens")
	})
}

// TestStartCleansUpOnFailure makes the apiserver fail after etcd and redis started: Start must
// return the apiserver's log tail and leave nothing running.
func TestStartCleansUpOnFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and redis-server")
	}
	fake := filepath.Join(t.TempDir(), "kube-apiserver")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho 'fake apiserver gives up' >&2\nexit 3\n"), 0o755))
	t.Setenv("KUBE_APISERVER", fake)
	_, err := Start(t.Context(), Options{Dir: t.TempDir(), Logf: t.Logf})
	require.Error(t, err)
	require.Contains(t, err.Error(), "kube-apiserver exited before it was ready")
	require.Contains(t, err.Error(), "fake apiserver gives up")
	require.Empty(t, childProcesses(t))
}

func TestMissingBinaries(t *testing.T) {
	root, err := moduleRoot()
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"))
	require.FileExists(t, filepath.Join(root, "test", "controlplane", "controlplane.go"))

	for _, b := range []builtBinary{kubeAPIServerBinary, etcdBinary} {
		t.Run(b.name, func(t *testing.T) {
			// The other one is found, so that Start fails on this one.
			for _, other := range []builtBinary{kubeAPIServerBinary, etcdBinary} {
				t.Setenv(other.env, "/bin/true")
			}
			t.Setenv(b.env, filepath.Join(t.TempDir(), "nope"))
			_, err := Start(t.Context(), Options{Dir: t.TempDir()})
			require.ErrorContains(t, err, b.env+"=")

			_, err = b.inRoot(t.TempDir())
			require.ErrorContains(t, err, "run `make "+b.name+"`")
		})
	}
}

func TestCAIssue(t *testing.T) {
	ca, err := NewCA("test")
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(ca.CertPEM))

	certPEM, keyPEM, err := ca.Issue("server", []string{"localhost"}, nil, false)
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost"})
	require.NoError(t, err)

	certPEM, keyPEM, err = ca.Issue("alice", nil, nil, true)
	require.NoError(t, err)
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	require.Equal(t, "alice", pair.Leaf.Subject.CommonName)
}

func testGitServer(t *testing.T, cp *ControlPlane) {
	ctx := t.Context()
	g := cp.Git
	bare, err := g.CreateRepo("team/config")
	require.NoError(t, err)
	require.Equal(t, g.RepoDir("team/config"), bare)
	require.True(t, strings.HasSuffix(g.URL("team/config"), "/team/config.git"))

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, g.CAData, 0o644))
	work := t.TempDir()
	gitCmd := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "http.sslCAInfo=" + caFile}, args...)...)
		cmd.Dir = work
		cmd.Env = append(gitEnv(work), "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=/bin/false",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
			"PATH="+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	withCreds := func(user, pass string) string {
		return strings.Replace(g.URL("team/config"), "https://", "https://"+user+":"+pass+"@", 1)
	}
	for _, args := range [][]string{
		{"init", "--quiet", "--initial-branch=main"},
		{"commit", "--quiet", "--allow-empty", "-m", "first"},
	} {
		out, err := gitCmd(args...)
		require.NoError(t, err, out)
	}

	out, err := gitCmd("push", withCreds(g.Username, "wrong-password"), "main")
	require.Error(t, err, "push with a wrong password must fail")
	require.Contains(t, out, "Authentication failed")

	out, err = gitCmd("push", withCreds(g.Username, g.Password), "main")
	require.NoError(t, err, out)
	head, err := exec.Command("git", "-C", bare, "rev-parse", "refs/heads/main").Output()
	require.NoError(t, err)
	local, err := gitCmd("rev-parse", "HEAD")
	require.NoError(t, err)
	require.Equal(t, strings.TrimSpace(local), strings.TrimSpace(string(head)))

	// go-git, as kubescribe uses it, can clone and push too.
	clone := t.TempDir()
	repo, err := git.PlainCloneContext(ctx, clone, false, &git.CloneOptions{
		URL: g.URL("team/config"), CABundle: g.CAData,
		Auth: &githttp.BasicAuth{Username: g.Username, Password: g.Password},
	})
	require.NoError(t, err)
	wt, err := repo.Worktree()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(clone, "hello.txt"), []byte("hello\n"), 0o644))
	_, err = wt.Add("hello.txt")
	require.NoError(t, err)
	sig := &object.Signature{Name: "go-git", Email: "go-git@example.com", When: time.Now()}
	_, err = wt.Commit("second", &git.CommitOptions{Author: sig, Committer: sig})
	require.NoError(t, err)
	require.NoError(t, repo.PushContext(ctx, &git.PushOptions{
		CABundle: g.CAData, Auth: &githttp.BasicAuth{Username: g.Username, Password: g.Password},
	}))
	content, err := exec.Command("git", "-C", bare, "show", "main:hello.txt").Output()
	require.NoError(t, err)
	require.Equal(t, "hello\n", string(content))

	err = repo.PushContext(ctx, &git.PushOptions{
		CABundle: g.CAData, Auth: &githttp.BasicAuth{Username: g.Username, Password: "wrong"},
	})
	require.Error(t, err)

	g.SetAvailable(false)
	out, err = gitCmd("ls-remote", withCreds(g.Username, g.Password))
	require.Error(t, err)
	require.Contains(t, out, "503")
	g.SetAvailable(true)
	out, err = gitCmd("ls-remote", withCreds(g.Username, g.Password))
	require.NoError(t, err, out)
	require.Contains(t, out, "refs/heads/main")
}

// serveAudit serves the audit endpoint like kubescribe must: TLS with the test certificates,
// client certificates verified against ClientCAFile. fn sees every request and its body.
func serveAudit(t *testing.T, cp *ControlPlane, fn func(r *http.Request, body []byte)) *http.Server {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(cp.Audit.CertFile, cp.Audit.KeyFile)
	require.NoError(t, err)
	caPEM, err := os.ReadFile(cp.Audit.ClientCAFile)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	srv := &http.Server{
		Addr: cp.Audit.ListenAddr,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fn(r, body)
			w.WriteHeader(http.StatusOK)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS12,
		},
	}
	ln, err := tls.Listen("tcp", cp.Audit.ListenAddr, srv.TLSConfig)
	require.NoError(t, err)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("audit endpoint: %v", err)
		}
	}()
	t.Cleanup(func() { srv.Close() })
	return srv
}

// childProcesses lists the live child processes of the test binary, from /proc.
func childProcesses(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	self := strconv.Itoa(os.Getpid())
	var children []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may contain spaces, so parse after the last ')'.
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) >= 2 && fields[1] == self {
			children = append(children, e.Name()+" "+s[:strings.LastIndexByte(s, ')')+1])
		}
	}
	return children
}
