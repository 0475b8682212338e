// Command snapshotload measures measurement (e) of issue 5: the snapshot of 10,000 ConfigMaps
// from the real apiserver to a pushed commit, and the server's memory after 10,000 further
// commits. It is not part of `make test`; run it with `make load-snapshot` (see
// docs/testing.md):
//
//	KUBE_APISERVER=$PWD/bin/kube-apiserver go run ./test/snapshotload -objects 10000 -changes 10000
//
// It starts the real control plane (test/stack), creates the ConfigMaps, runs kubescribe as
// the cmd/server binary, creates a GitProvider, GitTarget and WatchRule, and waits until the
// Git server's branch holds one file per ConfigMap. Then alice and bob, in turn, patch the
// ConfigMaps, one patch after the other, and it waits until every patch is committed and pushed.
// A commit window holds the changes of one author only, so alternating authors makes (nearly)
// every change its own commit whatever the commit window and the audit batching. The server's memory comes from
// /proc/<pid>/status: VmHWM (peak resident set) and VmRSS (resident set now), sampled every
// 100ms. Its peak is reset (clear_refs 5) between the two phases, so each phase has its own.
//
// With -pprof the server binary is built with an extra file (through `go build -overlay`, the
// server's source stays as it is) that serves net/http/pprof on a loopback port; the harness
// saves the heap profile taken when the resident set was largest, and the log gets
// GODEBUG=gctrace=1 lines.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/redis/go-redis/v9"

	"github.com/kubescribe/kubescribe/test/stack"
)

const ns = "snapload"

type config struct {
	objects, changes     int
	rounds               int
	createConcurrency    int
	patchConcurrency     int
	window               time.Duration
	idle                 time.Duration
	snapshotTimeout      time.Duration
	changesTimeout       time.Duration
	dir                  string
	keep, pprof, gctrace bool
	heapDump             bool
	facts                bool
	memProfileRate       int
	restart              bool
}

func main() {
	var c config
	flag.IntVar(&c.objects, "objects", 10000, "ConfigMaps in the snapshot")
	flag.IntVar(&c.changes, "changes", 10000, "further changes (patches by alice and bob in turn) after the snapshot; 0 skips the phase")
	flag.IntVar(&c.rounds, "rounds", 1, "rounds of further changes, each followed by the idle time: later rounds tell growth with the history from what the first round's work leaves")
	flag.IntVar(&c.createConcurrency, "create-concurrency", 16, "concurrent creates")
	flag.IntVar(&c.patchConcurrency, "patch-concurrency", 1, "concurrent patches (above 1, consecutive patches of one author may share a commit)")
	flag.DurationVar(&c.window, "commit-window", 5*time.Millisecond, "the GitProvider's commitWindow")
	flag.DurationVar(&c.idle, "idle", 30*time.Second, "how long the server is left idle after each phase before the settled RSS is read")
	flag.DurationVar(&c.snapshotTimeout, "snapshot-timeout", 10*time.Minute, "bound of the snapshot phase")
	flag.DurationVar(&c.changesTimeout, "changes-timeout", 30*time.Minute, "bound of the changes phase")
	flag.StringVar(&c.dir, "dir", "", "working directory (default: a new temporary one, removed unless -keep)")
	flag.BoolVar(&c.keep, "keep", false, "keep the working directory (logs, repositories, profiles)")
	flag.BoolVar(&c.pprof, "pprof", false, "build the server with net/http/pprof and save heap profiles (implies -keep)")
	flag.BoolVar(&c.heapDump, "heapdump", false, "with each idle profile, write the server's heap dump after a collection and report, per object size, the heap pages its live objects touch against what they would fill packed (implies -pprof)")
	flag.BoolVar(&c.gctrace, "gctrace", false, "run the server with GODEBUG=gctrace=1 (lines in kubescribe.log)")
	flag.IntVar(&c.memProfileRate, "memprofilerate", 0, "run the server with GODEBUG=memprofilerate=N: heap profiles sample every N bytes (Go's default 524288 leaves small objects to chance; 4096 counts them closely, a little slower)")
	flag.BoolVar(&c.restart, "restart", false, "at the end, stop the server and start it again with nothing changed: every stream resumes from its cursor and hands its objects over as unchanged (no commit expected); reports its wall time and peak against the snapshot's")
	flag.BoolVar(&c.facts, "facts", false, "keep the audit facts of the creates in Redis: the first commits are then the admin's creates, not one snapshot")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "snapshotload:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Printf("%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

func run(c config) (err error) {
	if c.heapDump {
		c.pprof = true
	}
	if c.pprof {
		c.keep = true
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kubescribe-snapload-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	keep := c.keep
	defer func() {
		if err != nil || keep {
			fmt.Println("files kept in", c.dir)
		} else {
			_ = os.RemoveAll(c.dir)
		}
	}()
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+c.snapshotTimeout+c.changesTimeout+2*c.idle+10*time.Minute)
	defer cancel()

	bin, pprofAddr, err := buildServer(root, c.dir, c.pprof)
	if err != nil {
		return err
	}
	logf("server binary %s", bin)

	began := time.Now()
	s, err := stack.Start(ctx, stack.Options{Dir: filepath.Join(c.dir, "stack"), Logf: logf})
	if err != nil {
		return fmt.Errorf("starting the stack: %w", err)
	}
	defer func() {
		if err != nil {
			s.DumpLogs(os.Stderr, 40)
		}
		if serr := s.Stop(); serr != nil {
			logf("stopping the stack: %v", serr)
		}
	}()
	logf("stack started in %s", time.Since(began).Round(time.Millisecond))

	repoDir, err := prepare(ctx, s)
	if err != nil {
		return err
	}
	began = time.Now()
	if err := createConfigMaps(ctx, s.AdminConfig, c.objects, c.createConcurrency); err != nil {
		return err
	}
	logf("created %d ConfigMaps in %s", c.objects, time.Since(began).Round(time.Millisecond))

	if !c.facts {
		// The in-process kubescribe of stack.Start recorded who created the ConfigMaps; once
		// those facts are in and it stopped, Redis is emptied so that the objects have no
		// author: one snapshot.
		if err := waitFacts(ctx, s, c.objects); err != nil {
			return err
		}
	}
	// kubescribe as a process: the in-process one of stack.Start makes way for it.
	if err := s.StopKubescribe(); err != nil {
		return err
	}
	if !c.facts {
		rdb := redis.NewClient(&redis.Options{Addr: s.RedisAddr})
		err := rdb.FlushAll(ctx).Err()
		_ = rdb.Close()
		if err != nil {
			return fmt.Errorf("emptying Redis: %w", err)
		}
	}
	var godebug []string
	if c.gctrace {
		godebug = append(godebug, "gctrace=1")
	}
	if c.memProfileRate > 0 {
		godebug = append(godebug, fmt.Sprintf("memprofilerate=%d", c.memProfileRate))
	}
	if len(godebug) > 0 {
		_ = os.Setenv("GODEBUG", strings.Join(godebug, ","))
	}
	if pprofAddr != "" {
		_ = os.Setenv("KUBESCRIBE_SNAPLOAD_PPROF", pprofAddr)
	}
	if err := s.StartKubescribeProcess(ctx, bin); err != nil {
		return err
	}
	_ = os.Unsetenv("GODEBUG")
	_ = os.Unsetenv("KUBESCRIBE_SNAPLOAD_PPROF")
	pid, err := childPID(bin)
	if err != nil {
		return err
	}
	logf("kubescribe runs as pid %d (log %s)", pid, s.LogPath)

	mon := newMonitor(pid, pprofAddr, c.dir)
	mon.heapDump = c.heapDump
	defer func() { mon.stop() }() // the last one: -restart replaces it
	var res results
	res.idleStart = mon.read()

	// Phase 1: the snapshot.
	mon.resetPeak("snapshot")
	began = time.Now()
	if err := createMirror(ctx, s, c.window); err != nil {
		return err
	}
	if err := waitFor(ctx, c.snapshotTimeout, time.Second, func() (bool, string) {
		n := len(gitLines(repoDir, "ls-tree", "-r", "--name-only", "main"))
		return n >= c.objects, fmt.Sprintf("%d of %d files on main", n, c.objects)
	}); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	res.snapshotWall = time.Since(began)
	res.snapshotCommits = len(gitLines(repoDir, "rev-list", "main"))
	res.snapshotEnd = mon.read()
	res.snapshotHeapTop = mon.peakProfile()
	logf("snapshot pushed in %s (%d commits): %s", res.snapshotWall.Round(time.Millisecond), res.snapshotCommits, res.snapshotEnd)
	res.snapshotIdle = mon.settle(ctx, c.idle)
	logf("after %s idle: %s; %s", c.idle, res.snapshotIdle, runtimeMemory(s))
	res.snapshotIdleTop = mon.idleProfile("snapshot")

	// Phase 2: further changes by alice and bob in turn, in rounds.
	for round := 0; c.changes > 0 && round < max(c.rounds, 1); round++ {
		base := strings.TrimSpace(gitOut(repoDir, "rev-parse", "main"))
		mon.resetPeak("changes")
		began = time.Now()
		if err := patchConfigMaps(ctx, []*rest.Config{s.UserConfig("alice"), s.UserConfig("bob")}, c.objects, round*c.changes, c.changes, c.patchConcurrency); err != nil {
			return err
		}
		patchWall := time.Since(began)
		logf("round %d: %d patches made in %s", round+1, c.changes, patchWall.Round(time.Millisecond))
		if err := waitFor(ctx, c.changesTimeout, 2*time.Second, func() (bool, string) {
			n := countUpdates(repoDir, base)
			return n >= c.changes, fmt.Sprintf("%d of %d changes pushed, %d commits", n, c.changes, len(gitLines(repoDir, "rev-list", base+"..main")))
		}); err != nil {
			return fmt.Errorf("changes: %w", err)
		}
		r := roundResult{wall: time.Since(began), commits: len(gitLines(repoDir, "rev-list", base+"..main")), end: mon.read()}
		logf("changes pushed in %s (%d commits): %s", r.wall.Round(time.Millisecond), r.commits, r.end)
		if round == 0 {
			res.patchWall, res.changesWall, res.changeCommits, res.changesEnd = patchWall, r.wall, r.commits, r.end
			res.changesHeapTop = mon.peakProfile()
		}
		r.idle = mon.settle(ctx, c.idle)
		logf("after %s idle: %s; %s", c.idle, r.idle, runtimeMemory(s))
		if round == 0 {
			res.changesIdle = r.idle
			res.changesIdleTop = mon.idleProfile("changes")
		} else {
			r.idleTop = mon.idleProfile(fmt.Sprintf("round%d", round+1))
			res.later = append(res.later, r)
		}
	}
	if c.restart {
		if mon, err = restart(ctx, c, s, bin, repoDir, mon, &res); err != nil {
			return fmt.Errorf("restart: %w", err)
		}
	}
	res.print(c)
	return nil
}

// restart stops the server (SIGTERM) and starts it again with nothing changed in between.
// Every stream resumes from its cursor and hands each object over as unchanged: the join
// passes them without a lookup, the writer finds every file as it is and commits nothing. The
// phase ends once the join has passed them all and neither the join nor the writer holds one.
// It returns the monitor of the new process.
func restart(ctx context.Context, c config, s *stack.Stack, bin, repoDir string, mon *monitor, res *results) (*monitor, error) {
	tip := strings.TrimSpace(gitOut(repoDir, "rev-parse", "main"))
	mon.stop()
	if err := s.StopKubescribe(); err != nil {
		return mon, err
	}
	began := time.Now()
	if err := s.StartKubescribeProcess(ctx, bin); err != nil {
		return mon, err
	}
	pid, err := childPID(bin)
	if err != nil {
		return mon, err
	}
	mon = newMonitor(pid, "", c.dir)
	mon.resetPeak("restart")
	if err := waitFor(ctx, c.snapshotTimeout, 200*time.Millisecond, func() (bool, string) {
		m, _ := s.ScrapeMetrics() // an unreadable page reads as nothing passed yet
		joined := m[`kubescribe_attribution_joins_total{result="snapshot"}`]
		waiting := m["kubescribe_attribution_pending_changes"] + m["kubescribe_git_pending_changes"]
		return joined >= float64(c.objects) && waiting == 0, fmt.Sprintf("%.0f of %d objects passed the join, %.0f changes held", joined, c.objects, waiting)
	}); err != nil {
		return mon, err
	}
	res.restartWall = time.Since(began)
	res.restartEnd = mon.read()
	res.restartCommits = len(gitLines(repoDir, "rev-list", tip+"..main"))
	logf("restarted and resumed in %s (%d commits): %s", res.restartWall.Round(time.Millisecond), res.restartCommits, res.restartEnd)
	return mon, nil
}

// waitFacts waits until Redis holds at least n keys and their number stays the same for two
// seconds: the audit events of the creates are in.
func waitFacts(ctx context.Context, s *stack.Stack, n int) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.RedisAddr})
	defer rdb.Close()
	last, same := int64(-1), 0
	if err := waitFor(ctx, 2*time.Minute, time.Second, func() (bool, string) {
		size, err := rdb.DBSize(ctx).Result()
		if err != nil {
			return false, err.Error()
		}
		if size == last {
			same++
		} else {
			last, same = size, 0
		}
		return size >= int64(n) && same >= 2, fmt.Sprintf("%d keys in Redis", size)
	}); err != nil {
		return fmt.Errorf("waiting for the audit facts of the creates: %w", err)
	}
	logf("%d Redis keys (the facts of the creates) will be dropped", last)
	return nil
}

// buildServer builds cmd/server into dir. With pprof it adds, through an overlay, a file that
// serves net/http/pprof on a loopback port, and returns that port's address.
func buildServer(root, dir string, pprof bool) (bin, pprofAddr string, err error) {
	bin = filepath.Join(dir, "kubescribe-server")
	args := []string{"build", "-o", bin}
	if pprof {
		src := filepath.Join(dir, "snapload_pprof.go")
		if err := os.WriteFile(src, []byte(pprofFile), 0o644); err != nil {
			return "", "", err
		}
		overlay, _ := json.Marshal(map[string]any{"Replace": map[string]string{
			filepath.Join(root, "cmd", "server", "zz_snapload_pprof.go"): src,
		}})
		ov := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(ov, overlay, 0o644); err != nil {
			return "", "", err
		}
		args = append(args, "-overlay", ov)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", "", err
		}
		pprofAddr = ln.Addr().String()
		_ = ln.Close()
	}
	cmd := exec.Command("go", append(args, "./cmd/server")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("building the server: %v: %s", err, out)
	}
	return bin, pprofAddr, nil
}

// pprofFile is added to package main of cmd/server only in the -pprof build.
const pprofFile = `package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
	"runtime/debug"
)

func init() {
	if addr := os.Getenv("KUBESCRIBE_SNAPLOAD_PPROF"); addr != "" {
		// A collection, then the heap dump into the file ?path= names (-heapdump).
		http.HandleFunc("/debug/snapload/heapdump", func(w http.ResponseWriter, r *http.Request) {
			f, err := os.Create(r.URL.Query().Get("path"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			runtime.GC()
			debug.WriteHeapDump(f.Fd())
			if err := f.Close(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		})
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
`

// childPID finds this process's child running bin.
func childPID(bin string) (int, error) {
	me := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != bin {
			continue
		}
		if st := procStatus(pid); st["PPid"] == strconv.Itoa(me) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no child process runs %s", bin)
}

// procStatus reads /proc/<pid>/status as name → first field.
func procStatus(pid int) map[string]string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if f := strings.Fields(v); ok && len(f) > 0 {
			m[k] = f[0]
		}
	}
	return m
}

// prepare creates the namespace, alice's and bob's Role, the Git credentials and the repository.
func prepare(ctx context.Context, s *stack.Stack) (repoDir string, err error) {
	admin, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return "", err
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "writers"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "writers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "writers"},
		Subjects: []rbacv1.Subject{
			{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"},
			{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "bob"},
		},
	}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "git-credentials"},
		Data: map[string][]byte{
			v1alpha1.SecretKeyUsername: []byte(s.Git.Username),
			v1alpha1.SecretKeyPassword: []byte(s.Git.Password),
			v1alpha1.SecretKeyCACert:   s.Git.CAData,
		},
	}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	return s.Git.CreateRepo(ns)
}

func fastConfig(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 2000, 4000
	return cfg
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func cmName(i int) string { return fmt.Sprintf("cm-%05d", i) }

// createConfigMaps creates n ConfigMaps of about 1 KiB each, as the admin.
func createConfigMaps(ctx context.Context, cfg *rest.Config, n, workers int) error {
	kube, err := kubernetes.NewForConfig(fastConfig(cfg))
	if err != nil {
		return err
	}
	payload := strings.Repeat("x", 1024)
	return parallel(ctx, n, workers, func(i int) error {
		_, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: cmName(i), Labels: map[string]string{"load": "snapshot"}},
			Data:       map[string]string{"payload": payload, "index": strconv.Itoa(i)},
		}, metav1.CreateOptions{})
		return err
	})
}

// patchConfigMaps makes n patches, patch i as the user of cfgs[i mod len(cfgs)], changing
// ConfigMap i mod objects to hold first+i.
func patchConfigMaps(ctx context.Context, cfgs []*rest.Config, objects, first, n, workers int) error {
	var kubes []kubernetes.Interface
	for _, cfg := range cfgs {
		kube, err := kubernetes.NewForConfig(fastConfig(cfg))
		if err != nil {
			return err
		}
		kubes = append(kubes, kube)
	}
	return parallel(ctx, n, workers, func(i int) error {
		patch := fmt.Sprintf(`{"data":{"changed":"%d"}}`, first+i)
		_, err := kubes[i%len(kubes)].CoreV1().ConfigMaps(ns).Patch(ctx, cmName(i%objects), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	})
}

// createMirror creates the GitProvider (with the given commit window), GitTarget and WatchRule
// that mirror the namespace's ConfigMaps into branch main.
func createMirror(ctx context.Context, s *stack.Stack, window time.Duration) error {
	dyn, err := dynamic.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	for _, o := range []struct {
		gvr schema.GroupVersionResource
		obj any
	}{
		{v1alpha1.GitProvidersResource, &v1alpha1.GitProvider{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
			ObjectMeta: metav1.ObjectMeta{Name: "repo", Namespace: ns},
			Spec: v1alpha1.GitProviderSpec{
				URL:          s.Git.URL(ns),
				SecretRef:    &v1alpha1.LocalObjectReference{Name: "git-credentials"},
				CommitWindow: &metav1.Duration{Duration: window},
			},
		}},
		{v1alpha1.GitTargetsResource, &v1alpha1.GitTarget{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
			ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: ns},
			Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main"},
		}},
		{v1alpha1.WatchRulesResource, &v1alpha1.WatchRule{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
			ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: ns},
			Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"},
				Rules: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}},
		}},
	} {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o.obj)
		if err != nil {
			return err
		}
		if _, err := dyn.Resource(o.gvr).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating %s: %w", o.gvr.Resource, err)
		}
	}
	return nil
}

// waitFor polls cond every interval until it holds, the timeout passes or ctx ends; it logs
// cond's progress note every 10s.
func waitFor(ctx context.Context, timeout, interval time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	lastLog := time.Now()
	for {
		ok, note := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s: %s", timeout, note)
		}
		if time.Since(lastLog) >= 10*time.Second {
			logf("  %s", note)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

func gitOut(repoDir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"--git-dir", repoDir}, args...)...).Output()
	if err != nil {
		return "" // e.g. no branch yet
	}
	return string(out)
}

func gitLines(repoDir string, args ...string) []string {
	s := strings.TrimRight(gitOut(repoDir, args...), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// countUpdates counts the "update ..." change lines of the commits after base.
func countUpdates(repoDir, base string) int {
	n := 0
	for _, l := range gitLines(repoDir, "log", "--format=%b", base+"..main") {
		if strings.HasPrefix(l, "update ") && strings.Contains(l, " resourceVersion=") {
			n++
		}
	}
	return n
}

// sample is the server's memory at one moment, in KiB. The resident set is anon (the heap,
// stacks and the runtime's own memory) plus file (the executable's pages that were touched).
type sample struct{ rss, hwm, anon, file int }

func (s sample) String() string {
	return fmt.Sprintf("VmRSS %.1f MiB (anon %.1f, file %.1f), VmHWM %.1f MiB", mib(s.rss), mib(s.anon), mib(s.file), mib(s.hwm))
}

func mib(kib int) float64 { return float64(kib) / 1024 }

// runtimeMemory reads the Go runtime's memory from the server's /metrics, read right after
// the resident set: heap in spans that hold an object, heap allocated (live, or garbage not
// collected yet), stacks, and the runtime's own structures (GC metadata, spans, profiling
// buckets, other). Unlike a heap profile it allocates next to nothing in the server.
func runtimeMemory(s *stack.Stack) string {
	v, err := s.ScrapeMetrics()
	if err != nil {
		return fmt.Sprintf("runtime memory: %v", err)
	}
	mb := func(names ...string) float64 {
		sum := 0.0
		for _, n := range names {
			sum += v["go_memstats_"+n]
		}
		return sum / (1 << 20)
	}
	return fmt.Sprintf("Go heap in use %.1f MiB, allocated %.1f, stacks %.1f, runtime %.1f",
		mb("heap_inuse_bytes"), mb("heap_alloc_bytes"), mb("stack_inuse_bytes"),
		mb("mspan_inuse_bytes", "mcache_inuse_bytes", "gc_sys_bytes", "other_sys_bytes", "buck_hash_sys_bytes"))
}

// monitor samples the server's /proc status every 100ms; with a pprof address it saves the
// heap profile whenever the resident set reaches a new high.
type monitor struct {
	pid       int
	pprofAddr string
	dir       string
	done      chan struct{}
	wg        sync.WaitGroup

	mu      sync.Mutex
	phase   string
	maxRSS  int
	profile string // path of the profile taken at maxRSS

	heapDump bool // idleProfile adds the heap dump's report
}

func newMonitor(pid int, pprofAddr, dir string) *monitor {
	m := &monitor{pid: pid, pprofAddr: pprofAddr, dir: dir, done: make(chan struct{}), phase: "start"}
	m.wg.Add(1)
	go m.loop()
	return m
}

func (m *monitor) read() sample {
	st := procStatus(m.pid)
	rss, _ := strconv.Atoi(st["VmRSS"])
	hwm, _ := strconv.Atoi(st["VmHWM"])
	anon, _ := strconv.Atoi(st["RssAnon"])
	file, _ := strconv.Atoi(st["RssFile"])
	return sample{rss: rss, hwm: hwm, anon: anon, file: file}
}

func (m *monitor) loop() {
	defer m.wg.Done()
	lastProfile := time.Time{}
	for {
		select {
		case <-m.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
		s := m.read()
		m.mu.Lock()
		grew := s.rss > m.maxRSS+1024 // a new high by more than 1 MiB
		if s.rss > m.maxRSS {
			m.maxRSS = s.rss
		}
		phase := m.phase
		m.mu.Unlock()
		if grew && m.pprofAddr != "" && time.Since(lastProfile) > 500*time.Millisecond {
			lastProfile = time.Now()
			path := filepath.Join(m.dir, fmt.Sprintf("heap-%s-%06dKiB.pb.gz", phase, s.rss))
			if err := fetch("http://"+m.pprofAddr+"/debug/pprof/heap", path); err == nil {
				m.mu.Lock()
				m.profile = path
				m.mu.Unlock()
			}
		}
	}
}

// resetPeak resets the server's VmHWM (clear_refs 5) and the monitor's high mark.
func (m *monitor) resetPeak(phase string) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", m.pid), []byte("5"), 0); err != nil {
		logf("cannot reset the peak RSS (%v): VmHWM covers the whole run", err)
	}
	m.mu.Lock()
	m.phase, m.maxRSS, m.profile = phase, 0, ""
	m.mu.Unlock()
}

// peakProfile returns the top of the heap profile taken at the phase's high mark ("" without
// -pprof).
func (m *monitor) peakProfile() string {
	m.mu.Lock()
	path := m.profile
	m.mu.Unlock()
	return profileTop(path)
}

// idleProfile takes a heap profile now, saved as heap-<name>-idle, and returns its top (""
// without -pprof).
func (m *monitor) idleProfile(name string) string {
	if m.pprofAddr == "" {
		return ""
	}
	path := filepath.Join(m.dir, fmt.Sprintf("heap-%s-idle.pb.gz", name))
	if err := fetch("http://"+m.pprofAddr+"/debug/pprof/heap", path); err != nil {
		return fmt.Sprintf("%s: %v", path, err)
	}
	// The text form ends with the runtime's MemStats: heap in use against heap allocated
	// tells fragmentation from live data.
	text := strings.TrimSuffix(path, ".pb.gz") + ".txt"
	if err := fetch("http://"+m.pprofAddr+"/debug/pprof/heap?debug=1", text); err != nil {
		return fmt.Sprintf("%s: %v", text, err)
	}
	report := profileTop(path) + memStats(text)
	if m.heapDump {
		dump := filepath.Join(m.dir, fmt.Sprintf("heap-%s-idle.dump", name))
		if err := fetch("http://"+m.pprofAddr+"/debug/snapload/heapdump?path="+url.QueryEscape(dump), os.DevNull); err != nil {
			return report + fmt.Sprintf("%s: %v\n", dump, err)
		}
		report += heapDumpReport(dump, 25)
	}
	return report
}

// memStats returns the heap's lines of the MemStats a text heap profile ends with.
func memStats(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var out strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"# HeapAlloc", "# HeapInuse", "# HeapIdle", "# HeapReleased", "# Stack", "# MSpan", "# GCSys", "# OtherSys", "# NumGC"} {
			if strings.HasPrefix(l, k) {
				out.WriteString(l + "\n")
			}
		}
	}
	return out.String()
}

func profileTop(path string) string {
	if path == "" {
		return ""
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", "-sample_index=inuse_space", path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: %v", path, err)
	}
	return path + "\n" + string(out)
}

// settle leaves the server idle for d and returns its memory then.
func (m *monitor) settle(ctx context.Context, d time.Duration) sample {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return m.read()
}

func (m *monitor) stop() {
	close(m.done)
	m.wg.Wait()
}

func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

type results struct {
	idleStart                                          sample
	snapshotWall, patchWall, changesWall               time.Duration
	snapshotCommits, changeCommits                     int
	snapshotEnd, snapshotIdle, changesEnd, changesIdle sample
	snapshotHeapTop, changesHeapTop                    string
	snapshotIdleTop, changesIdleTop                    string
	later                                              []roundResult // rounds after the first
	restartWall                                        time.Duration // -restart
	restartCommits                                     int
	restartEnd                                         sample
}

// roundResult is one round of further changes.
type roundResult struct {
	wall      time.Duration
	commits   int
	end, idle sample
	idleTop   string // with -pprof, the heap profile after the idle time
}

func (r results) print(c config) {
	fmt.Println()
	fmt.Printf("snapshot load: %d ConfigMaps, %d further changes, commitWindow %s\n", c.objects, c.changes, c.window)
	fmt.Printf("%-44s %12s %12s %12s %12s %12s\n", "", "wall", "VmRSS MiB", "anon MiB", "file MiB", "VmHWM MiB")
	row := func(name string, wall time.Duration, s sample) {
		w := "-"
		if wall > 0 {
			w = wall.Round(10 * time.Millisecond).String()
		}
		fmt.Printf("%-44s %12s %12.1f %12.1f %12.1f %12.1f\n", name, w, mib(s.rss), mib(s.anon), mib(s.file), mib(s.hwm))
	}
	row("server started, idle", 0, r.idleStart)
	row(fmt.Sprintf("snapshot pushed (%d commits)", r.snapshotCommits), r.snapshotWall, r.snapshotEnd)
	row(fmt.Sprintf("  after %s idle", c.idle), 0, r.snapshotIdle)
	if c.changes > 0 {
		row(fmt.Sprintf("%d changes pushed (%d commits)", c.changes, r.changeCommits), r.changesWall, r.changesEnd)
		row(fmt.Sprintf("  after %s idle", c.idle), 0, r.changesIdle)
		for i, l := range r.later {
			row(fmt.Sprintf("round %d: %d changes pushed (%d commits)", i+2, c.changes, l.commits), l.wall, l.end)
			row(fmt.Sprintf("  after %s idle", c.idle), 0, l.idle)
		}
		fmt.Printf("(patches made in %s; VmHWM is reset before each phase, so it is that phase's peak)\n", r.patchWall.Round(10*time.Millisecond))
	}
	if c.restart {
		row(fmt.Sprintf("restart, resumed (%d commits)", r.restartCommits), r.restartWall, r.restartEnd)
		fmt.Printf("(restart against the snapshot: %.2fx its wall time, %.2fx its peak)\n",
			r.restartWall.Seconds()/r.snapshotWall.Seconds(), float64(r.restartEnd.hwm)/float64(r.snapshotEnd.hwm))
	}
	after := "not measured"
	if c.changes > 0 {
		after = verdict(r.changesIdle.rss <= r.snapshotIdle.rss)
	}
	fmt.Printf("target: snapshot peak < 120 MiB: %s; RSS after the changes no higher than after the snapshot: %s\n",
		verdict(mib(r.snapshotEnd.hwm) < 120), after)
	for _, p := range []struct{ name, top string }{
		{"at the snapshot phase's RSS high mark", r.snapshotHeapTop},
		{"after the snapshot and the idle time", r.snapshotIdleTop},
		{"at the changes phase's RSS high mark", r.changesHeapTop},
		{"after the changes and the idle time", r.changesIdleTop},
	} {
		if p.top != "" {
			fmt.Printf("\nheap profile %s: %s\n", p.name, p.top)
		}
	}
	for i, l := range r.later {
		if l.idleTop != "" {
			fmt.Printf("\nheap profile after round %d and the idle time: %s\n", i+2, l.idleTop)
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}
