// Command load is kubescribe's load test (`make load`, issue 8): the real stack of test/stack
// (etcd, kube-apiserver with its audit webhook pointed at kubescribe, redis-server, an HTTPS Git
// server, kubescribe in-process), and a bounded load generator writing ConfigMaps and
// PodTemplates as several users, as fast as the apiserver accepts, for a fixed time. Then it
// waits for the Git repository to settle and checks every commit's author.
//
// It reports writes/s, audit events/s received by kubescribe, the apiserver's own audit
// counters (apiserver_audit_event_total, apiserver_audit_error_total), the audit handler's
// latency, and the author check: every commit must be authored by the one user who writes the
// objects it touches (each object has exactly one writer, named in its name), none
// unresolved, and the repository must end up holding exactly the live objects.
//
// Everything listens on 127.0.0.1. The load is bounded by -duration and -max-writes; the
// settling by -settle. Exit status 1 when a check fails.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/test/stack"
)

const (
	namespace  = "load"
	targetPath = "clusters/load"
)

type options struct {
	duration         time.Duration
	maxWrites        int64
	users            []string
	workersPerUser   int
	objectsPerWorker int
	settle           time.Duration
	keep             bool
	replicas         int
}

func main() {
	var o options
	var users string
	flag.DurationVar(&o.duration, "duration", time.Minute, "how long the writers write")
	flag.Int64Var(&o.maxWrites, "max-writes", 200_000, "stop the writers after this many writes in all")
	flag.StringVar(&users, "users", "alice,bob,carol", "comma-separated writers (token users of the control plane)")
	flag.IntVar(&o.workersPerUser, "workers-per-user", 2, "concurrent writers per user")
	flag.IntVar(&o.objectsPerWorker, "objects-per-worker", 10, "objects of each type each writer cycles through")
	flag.DurationVar(&o.settle, "settle", 5*time.Minute, "how long to wait for the repository to catch up after the load")
	flag.BoolVar(&o.keep, "keep", false, "keep the stack's directory (logs, repository) after the run")
	flag.IntVar(&o.replicas, "replicas", 0, "run kubescribe as this many processes of cmd/server behind a balancer, coordinating through Leases, as the Deployment does; 0 runs one in the load's own process")
	flag.Parse()
	o.users = strings.Split(users, ",")
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("%s ==> %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(o options) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "kubescribe-load-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep || err != nil {
			fmt.Printf("stack directory kept: %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	step("starting the stack in %s", dir)
	s, err := stack.Start(ctx, stack.Options{Dir: dir, Logf: func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := s.Stop(); stopErr != nil {
			fmt.Fprintln(os.Stderr, "load: stopping:", stopErr)
		}
	}()
	if o.replicas > 0 {
		if err := startReplicas(ctx, s, dir, o.replicas); err != nil {
			return err
		}
	}
	repoDir, err := s.Git.CreateRepo("load")
	if err != nil {
		return err
	}
	if err := stack.Apply(ctx, s.AdminConfig, []byte(manifests(s, o.users))); err != nil {
		return err
	}
	if err := waitFor(ctx, time.Minute, "the WatchRule's streams", func() (bool, error) {
		// The initial snapshot of the empty namespace commits nothing; a first write shows the
		// watch is up: wait until kubescribe mirrors a probe object.
		return probeMirrored(ctx, s, repoDir)
	}); err != nil {
		return err
	}

	apiBefore, err := apiserverAuditCounters(ctx, s)
	if err != nil {
		return err
	}
	redisBefore, err := redisStats(ctx, s)
	if err != nil {
		return err
	}
	ksBefore, err := scrape(s)
	if err != nil {
		return err
	}

	step("load: %d users x %d writers, %d ConfigMaps and %d PodTemplates each, for %s (at most %d writes)",
		len(o.users), o.workersPerUser, o.objectsPerWorker, o.objectsPerWorker, o.duration, o.maxWrites)
	res, err := generate(ctx, s, o)
	if err != nil {
		return err
	}
	elapsed := res.elapsed.Seconds()
	ksAfterLoad, err := scrape(s)
	if err != nil {
		return err
	}
	redisAfterLoad, err := redisStats(ctx, s)
	if err != nil {
		return err
	}
	step("load done: %d writes in %.1fs (%.0f writes/s), %d refused or failed",
		res.writes.Load(), elapsed, float64(res.writes.Load())/elapsed, res.failures.Load())
	for _, k := range sortedKeys(res.byKind) {
		fmt.Printf("    %-28s %d\n", k, res.byKind[k].Load())
	}

	step("waiting up to %s for the repository to hold exactly the live objects", o.settle)
	settleStart := time.Now()
	mismatch, err := settle(ctx, s, repoDir, o.settle)
	if err != nil {
		return err
	}
	if len(mismatch) == 0 {
		step("settled %.1fs after the load", time.Since(settleStart).Seconds())
	} else {
		step("not settled after %.1fs (kubescribe idle, repository unchanged): %d differences", time.Since(settleStart).Seconds(), len(mismatch))
	}

	ksAfter, err := scrape(s)
	if err != nil {
		return err
	}
	apiAfter, err := apiserverAuditCounters(ctx, s)
	if err != nil {
		return err
	}
	events := func(m metrics) float64 { return m.sum("kubescribe_audit_events_total", "") }
	fmt.Printf("\nresults\n")
	fmt.Printf("    writes:                        %d in %.1fs = %.0f writes/s\n", res.writes.Load(), elapsed, float64(res.writes.Load())/elapsed)
	fmt.Printf("    audit events received (load):  %.0f = %.0f events/s\n", events(ksAfterLoad)-events(ksBefore), (events(ksAfterLoad)-events(ksBefore))/elapsed)
	fmt.Printf("    audit events received (total): %.0f (kept %.0f)\n", events(ksAfter)-events(ksBefore),
		ksAfter.sum("kubescribe_audit_events_total", `result="kept"`)-ksBefore.sum("kubescribe_audit_events_total", `result="kept"`))
	batches := ksAfter.sum("kubescribe_audit_handler_duration_seconds_count", "") - ksBefore.sum("kubescribe_audit_handler_duration_seconds_count", "")
	secs := ksAfter.sum("kubescribe_audit_handler_duration_seconds_sum", "") - ksBefore.sum("kubescribe_audit_handler_duration_seconds_sum", "")
	if batches > 0 {
		fmt.Printf("    audit batches:                 %.0f, %.1f events each, handler mean %.2f ms\n", batches,
			(events(ksAfter)-events(ksBefore))/batches, 1000*secs/batches)
	}
	for _, code := range []string{"200", "400", "413", "503"} {
		if n := ksAfter.sum("kubescribe_audit_requests_total", `code="`+code+`"`) - ksBefore.sum("kubescribe_audit_requests_total", `code="`+code+`"`); n > 0 || code == "200" {
			fmt.Printf("    audit answers %s:             %.0f\n", code, n)
		}
	}
	fmt.Printf("    apiserver_audit_event_total:   %.0f (during the run: %.0f)\n", apiAfter.events, apiAfter.events-apiBefore.events)
	fmt.Printf("    apiserver_audit_error_total:   %.0f (during the run: %.0f) %s\n", apiAfter.errors, apiAfter.errors-apiBefore.errors, apiAfter.errorDetail)
	for _, r := range replicaRSS(s) {
		fmt.Printf("    %s\n", r)
	}
	redisAfter, err := redisStats(ctx, s)
	if err != nil {
		return err
	}
	fmt.Printf("    redis commands (load):         %.0f = %.0f/s\n", redisAfterLoad.commands-redisBefore.commands, (redisAfterLoad.commands-redisBefore.commands)/elapsed)
	fmt.Printf("    redis memory:                  %.1f MiB before, %.1f MiB after the load, %.1f MiB settled\n",
		redisBefore.memory/(1<<20), redisAfterLoad.memory/(1<<20), redisAfter.memory/(1<<20))
	fmt.Printf("    redis keys after the load:     %s\n", redisAfterLoad.keysString())
	unresolved := ksAfter.sum("kubescribe_attribution_joins_total", `result="unresolved"`) - ksBefore.sum("kubescribe_attribution_joins_total", `result="unresolved"`)
	resolved := ksAfter.sum("kubescribe_attribution_joins_total", `result="resolved"`) - ksBefore.sum("kubescribe_attribution_joins_total", `result="resolved"`)
	fmt.Printf("    joins: resolved %.0f, unresolved %.0f\n", resolved, unresolved)

	check, err := checkAuthors(ctx, repoDir, o.users)
	if err != nil {
		return err
	}
	fmt.Printf("    commits: %d (%d touching load objects); by author: %s\n", check.commits, check.loadCommits, check.byAuthorString())
	fmt.Printf("    authors checked: %d commits, %d unresolved, %d wrong\n", check.loadCommits, check.unresolved, check.wrong)
	for _, m := range check.examples {
		fmt.Printf("      %s\n", m)
	}

	var failed []string
	if len(mismatch) > 0 {
		failed = append(failed, fmt.Sprintf("the repository differs from the cluster in %d objects", len(mismatch)))
		for i, m := range mismatch {
			if i == 10 {
				fmt.Printf("      ...\n")
				break
			}
			fmt.Printf("      %s\n", m)
		}
	}
	if check.unresolved > 0 || unresolved > 0 {
		failed = append(failed, "unresolved authors (dropped attributions)")
	}
	if check.wrong > 0 {
		failed = append(failed, "wrong authors")
	}
	if apiAfter.errors-apiBefore.errors > 0 {
		failed = append(failed, "the apiserver dropped audit events (apiserver_audit_error_total)")
	}
	if len(failed) > 0 {
		return fmt.Errorf("FAILED: %s; logs: %s", strings.Join(failed, "; "), strings.Join(s.LogPaths(), " "))
	}
	step("PASS: 0 dropped, 0 wrong")
	return nil
}

func manifests(s *stack.Stack, users []string) string {
	var subjects strings.Builder
	for _, u := range users {
		fmt.Fprintf(&subjects, "- {apiGroup: rbac.authorization.k8s.io, kind: User, name: %s}\n", u)
	}
	ca := "    " + strings.ReplaceAll(strings.TrimRight(string(s.Git.CAData), "\n"), "\n", "\n    ")
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: writers, namespace: %[1]s}
rules:
- apiGroups: [""]
  resources: [configmaps, podtemplates]
  verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: writers, namespace: %[1]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: writers}
subjects:
%[2]s---
apiVersion: v1
kind: Secret
metadata: {name: git-credentials, namespace: %[1]s}
stringData:
  username: %[3]s
  password: %[4]s
  ca.crt: |
%[5]s
---
apiVersion: kubescribe.dev/v1alpha1
kind: GitProvider
metadata: {name: repo, namespace: %[1]s}
spec:
  url: %[6]s
  secretRef: {name: git-credentials}
  commitWindow: 1s
---
apiVersion: kubescribe.dev/v1alpha1
kind: GitTarget
metadata: {name: load, namespace: %[1]s}
spec:
  providerRef: {name: repo}
  branch: main
  path: %[7]s
---
apiVersion: kubescribe.dev/v1alpha1
kind: WatchRule
metadata: {name: load, namespace: %[1]s}
spec:
  targetRef: {name: load}
  rules:
  - apiGroups: [""]
    resources: [configmaps, podtemplates]
`, namespace, subjects.String(), s.Git.Username, s.Git.Password, ca, s.Git.URL("load"), targetPath)
}

// probeMirrored creates (once) and looks for a probe ConfigMap written by admin.
func probeMirrored(ctx context.Context, s *stack.Stack, repoDir string) (bool, error) {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return false, err
	}
	_, err = kube.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
		return false, err
	}
	files, err := repoFiles(ctx, repoDir)
	if err != nil {
		return false, nil // no branch yet
	}
	_, ok := files[objectPath("configmaps", "probe")]
	return ok, nil
}

type result struct {
	writes, failures atomic.Int64
	byKind           map[string]*atomic.Int64
	elapsed          time.Duration
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// generate runs the writers: each owns objectsPerWorker ConfigMaps and as many PodTemplates,
// named <user>-<worker>-<n>, and cycles through them: create, then patches, and every fifth
// write of an object a delete (the next write creates it again).
func generate(ctx context.Context, s *stack.Stack, o options) (*result, error) {
	res := &result{byKind: map[string]*atomic.Int64{}}
	for _, k := range []string{"configmaps/create", "configmaps/patch", "configmaps/delete", "podtemplates/create", "podtemplates/patch", "podtemplates/delete"} {
		res.byKind[k] = new(atomic.Int64)
	}
	// Writers stop starting writes at the deadline but never cancel one in flight: the
	// apiserver may complete a write whose client went away and audit it as failed.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stopping atomic.Bool
	deadline := time.AfterFunc(o.duration, func() { stopping.Store(true) })
	defer deadline.Stop()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for _, user := range o.users {
		cfg := s.UserConfig(user)
		cfg.QPS, cfg.Burst = -1, 0 // no client-side throttling: as fast as the apiserver accepts
		kube, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		for w := range o.workersPerUser {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := writer(ctx, &stopping, kube, user, w, o, res); err != nil && ctx.Err() == nil {
					firstErr.CompareAndSwap(nil, err)
					cancel()
				}
			}()
		}
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return nil, err
	}
	return res, nil
}

func writer(ctx context.Context, stopping *atomic.Bool, kube kubernetes.Interface, user string, w int, o options, res *result) error {
	cms := kube.CoreV1().ConfigMaps(namespace)
	pts := kube.CoreV1().PodTemplates(namespace)
	type state struct {
		exists bool
		n      int
	}
	objs := make([]state, 2*o.objectsPerWorker)
	for i := 0; ctx.Err() == nil && !stopping.Load(); i++ {
		if res.writes.Load() >= o.maxWrites {
			return nil
		}
		k := i % len(objs)
		kind := "configmaps"
		if k >= o.objectsPerWorker {
			kind = "podtemplates"
		}
		name := fmt.Sprintf("%s-%d-%d", user, w, k%o.objectsPerWorker)
		st := &objs[k]
		st.n++
		var verb string
		var err error
		switch {
		case !st.exists:
			verb = "create"
			if kind == "configmaps" {
				_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"n": strconv.Itoa(st.n)}}, metav1.CreateOptions{})
			} else {
				_, err = pts.Create(ctx, podTemplate(name, st.n), metav1.CreateOptions{})
			}
		case st.n%5 == 0:
			verb = "delete"
			if kind == "configmaps" {
				err = cms.Delete(ctx, name, metav1.DeleteOptions{})
			} else {
				err = pts.Delete(ctx, name, metav1.DeleteOptions{})
			}
		default:
			verb = "patch"
			if kind == "configmaps" {
				_, err = cms.Patch(ctx, name, types.MergePatchType, fmt.Appendf(nil, `{"data":{"n":"%d"}}`, st.n), metav1.PatchOptions{})
			} else {
				_, err = pts.Patch(ctx, name, types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"n":"%d"}}}`, st.n), metav1.PatchOptions{})
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// Under overload the apiserver may refuse (429) or time out; that write did not
			// happen, and the object's state is unknown: read it again.
			res.failures.Add(1)
			if apierrors.IsTooManyRequests(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
				st.exists = !apierrors.IsNotFound(err)
				continue
			}
			return fmt.Errorf("%s %s %s/%s: %w", user, verb, kind, name, err)
		}
		st.exists = verb != "delete"
		res.writes.Add(1)
		res.byKind[kind+"/"+verb].Add(1)
	}
	return nil
}

func podTemplate(name string, n int) *corev1.PodTemplate {
	return &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"n": strconv.Itoa(n)}},
		Template:   corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example.com/app:1"}}}},
	}
}

func objectPath(resource, name string) string {
	return path.Join(targetPath, namespace, "core", resource, name+".yaml")
}

// repoFiles lists the files of main (path -> blob id).
func repoFiles(ctx context.Context, repoDir string) (map[string]string, error) {
	out, err := exec.CommandContext(ctx, "git", "--git-dir", repoDir, "ls-tree", "-r", "main").Output()
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// <mode> blob <id>\t<path>
		meta, p, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		fields := strings.Fields(meta)
		files[p] = fields[len(fields)-1]
	}
	return files, nil
}

// repoMismatch says how main differs from the live load objects (each with its live
// counter); nil when it holds exactly them.
func repoMismatch(ctx context.Context, s *stack.Stack, repoDir string) ([]string, error) {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return nil, err
	}
	want := map[string]string{} // path -> counter
	cms, err := kube.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, cm := range cms.Items {
		if cm.Name == "kube-root-ca.crt" {
			continue
		}
		want[objectPath("configmaps", cm.Name)] = cm.Data["n"]
	}
	pts, err := kube.CoreV1().PodTemplates(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, pt := range pts.Items {
		want[objectPath("podtemplates", pt.Name)] = pt.Labels["n"]
	}
	files, err := repoFiles(ctx, repoDir)
	if err != nil {
		return []string{"no branch main yet"}, nil
	}
	var diffs []string
	for p := range files {
		if _, ok := want[p]; !ok && strings.HasPrefix(p, path.Join(targetPath, namespace)+"/") {
			diffs = append(diffs, p+" is in Git but not in the cluster")
		}
	}
	for p, n := range want {
		blob, ok := files[p]
		if !ok {
			diffs = append(diffs, p+" is in the cluster but not in Git")
			continue
		}
		if n == "" {
			continue
		}
		out, err := exec.CommandContext(ctx, "git", "--git-dir", repoDir, "cat-file", "blob", blob).Output()
		if err != nil {
			return nil, err
		}
		var obj struct {
			Data     map[string]string `json:"data"`
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(out, &obj); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if obj.Data["n"] != n && obj.Metadata.Labels["n"] != n {
			diffs = append(diffs, fmt.Sprintf("%s holds n=%q/%q, the cluster n=%q", p, obj.Data["n"], obj.Metadata.Labels["n"], n))
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

// settle waits until the repository holds exactly the live objects, or until timeout, or
// until kubescribe has nothing pending and the repository's tip has not moved for
// idleFor: then waiting longer changes nothing. It returns the remaining differences.
func settle(ctx context.Context, s *stack.Stack, repoDir string, timeout time.Duration) ([]string, error) {
	const idleFor = 20 * time.Second
	deadline := time.Now().Add(timeout)
	var lastTip string
	lastMove := time.Now()
	for {
		diffs, err := repoMismatch(ctx, s, repoDir)
		if err != nil || len(diffs) == 0 {
			return diffs, err
		}
		tip, _ := exec.CommandContext(ctx, "git", "--git-dir", repoDir, "rev-parse", "main").Output()
		if string(tip) != lastTip {
			lastTip, lastMove = string(tip), time.Now()
		}
		m, err := scrape(s)
		if err != nil {
			return nil, err
		}
		idle := m.sum("kubescribe_attribution_pending_changes", "") == 0 && time.Since(lastMove) > idleFor
		if idle || time.Now().After(deadline) {
			return diffs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

type authorCheck struct {
	commits, loadCommits int
	unresolved, wrong    int
	byAuthor             map[string]int
	examples             []string
}

func (c *authorCheck) byAuthorString() string {
	var parts []string
	for _, a := range sortedKeys(c.byAuthor) {
		parts = append(parts, fmt.Sprintf("%s %d", a, c.byAuthor[a]))
	}
	return strings.Join(parts, ", ")
}

// checkAuthors reads every commit of main: a commit touching load objects must be authored
// by their one writer (the user their names start with).
func checkAuthors(ctx context.Context, repoDir string, users []string) (*authorCheck, error) {
	cmd := exec.CommandContext(ctx, "git", "--git-dir", repoDir, "log", "--format=%x00%H %an", "--name-only", "main")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &authorCheck{byAuthor: map[string]int{}}
	isUser := map[string]bool{}
	for _, u := range users {
		isUser[u] = true
	}
	var commit, author string
	var writers map[string]bool
	flush := func() {
		if commit == "" {
			return
		}
		c.commits++
		c.byAuthor[author]++
		if len(writers) == 0 {
			return
		}
		c.loadCommits++
		if author == attribution.UnresolvedUsername {
			c.unresolved++
			c.example("%s unresolved", commit)
			return
		}
		for w := range writers {
			if w != author {
				c.wrong++
				c.example("%s authored by %s touches objects of %s", commit, author, w)
				return
			}
		}
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "\x00"); ok {
			flush()
			commit, author, _ = strings.Cut(rest, " ")
			writers = map[string]bool{}
			continue
		}
		if line == "" || !strings.HasPrefix(line, path.Join(targetPath, namespace)+"/") {
			continue
		}
		name := strings.TrimSuffix(path.Base(line), ".yaml")
		if w, _, ok := strings.Cut(name, "-"); ok && isUser[w] {
			writers[w] = true
		}
	}
	flush()
	if err := cmd.Wait(); err != nil {
		return nil, err
	}
	return c, sc.Err()
}

func (c *authorCheck) example(format string, args ...any) {
	if len(c.examples) < 10 {
		c.examples = append(c.examples, fmt.Sprintf(format, args...))
	}
}

type auditCounters struct {
	events, errors float64
	errorDetail    string
}

// apiserverAuditCounters reads apiserver_audit_event_total and apiserver_audit_error_total
// from the apiserver's /metrics, as admin.
func apiserverAuditCounters(ctx context.Context, s *stack.Stack) (auditCounters, error) {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return auditCounters{}, err
	}
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return auditCounters{}, fmt.Errorf("apiserver /metrics: %w", err)
	}
	m := metrics(stack.ParseMetrics(raw))
	c := auditCounters{events: m.sum("apiserver_audit_event_total", ""), errors: m.sum("apiserver_audit_error_total", "")}
	for _, l := range m.lines("apiserver_audit_error_total") {
		c.errorDetail += " " + l
	}
	return c, nil
}

type metrics map[string]float64 // "name{labels}" -> value

// scrape reads kubescribe's /metrics.
// scrape reads kubescribe's metrics: the in-process one's, or the sum over the replicas.
func scrape(s *stack.Stack) (metrics, error) {
	rs := s.Replicas()
	if len(rs) == 0 {
		m, err := s.ScrapeMetrics()
		return metrics(m), err
	}
	sum := metrics{}
	for _, r := range rs {
		m, err := r.ScrapeMetrics()
		if err != nil {
			return nil, fmt.Errorf("replica %s: %w", r.Name, err)
		}
		for k, v := range m {
			sum[k] += v
		}
	}
	return sum, nil
}

// startReplicas builds cmd/server and replaces the stack's kubescribe with n processes of it.
func startReplicas(ctx context.Context, s *stack.Stack, dir string, n int) error {
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	bin := path.Join(dir, "kubescribe-server")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/server")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/server: %w: %s", err, out)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("kubescribe-%d", i)
	}
	step("kubescribe as %d replicas behind a balancer: %s", n, strings.Join(names, ", "))
	return s.StartReplicas(ctx, bin, names...)
}

// replicaRSS describes each replica's resident memory now and at its peak (VmRSS, VmHWM).
func replicaRSS(s *stack.Stack) []string {
	var out []string
	for _, r := range s.Replicas() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.PID()))
		if err != nil {
			continue
		}
		var rss, peak string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				rss = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				peak = strings.TrimSpace(v)
			}
		}
		out = append(out, fmt.Sprintf("replica %-14s RSS %s (peak %s)", r.Name, rss, peak))
	}
	sort.Strings(out)
	return out
}

// sum adds the series of metric name whose labels contain filter.
func (m metrics) sum(name, filter string) float64 {
	var total float64
	for k, v := range m {
		n, labels, _ := strings.Cut(k, "{")
		if n == name && strings.Contains(labels, filter) {
			total += v
		}
	}
	return total
}

func (m metrics) lines(name string) []string {
	var out []string
	for _, k := range sortedKeys(m) {
		if n, _, _ := strings.Cut(k, "{"); n == name {
			out = append(out, fmt.Sprintf("%s=%g", k, m[k]))
		}
	}
	return out
}

// waitFor polls cond every half second until it holds, fails, or timeout passes. (A command,
// not a test: polling a real system's state is what it does.)
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), fmt.Errorf("waiting for %s", what))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// redisInfo is what the load reports of Redis: commands processed, memory used, keys by kind
// (the second part of their name: fact, cursor, wait, ...).
type redisInfo struct {
	commands, memory float64
	keys             map[string]int
}

func (r redisInfo) keysString() string {
	var parts []string
	for _, k := range sortedKeys(r.keys) {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.keys[k]))
	}
	return strings.Join(parts, ", ")
}

// redisStats reads INFO and counts the keys by kind, with redis-cli.
func redisStats(ctx context.Context, s *stack.Stack) (redisInfo, error) {
	host, port, _ := strings.Cut(s.RedisAddr, ":")
	cli := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"-h", host, "-p", port}, args...)...).Output()
		return string(out), err
	}
	info, err := cli("INFO")
	if err != nil {
		return redisInfo{}, fmt.Errorf("redis-cli INFO: %w", err)
	}
	r := redisInfo{keys: map[string]int{}}
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "total_commands_processed":
			r.commands, _ = strconv.ParseFloat(v, 64)
		case "used_memory":
			r.memory, _ = strconv.ParseFloat(v, 64)
		}
	}
	keys, err := cli("--scan")
	if err != nil {
		return redisInfo{}, fmt.Errorf("redis-cli --scan: %w", err)
	}
	for _, k := range strings.Fields(keys) {
		parts := strings.SplitN(k, ":", 3)
		kind := parts[0]
		if len(parts) > 1 {
			kind = parts[1]
		}
		r.keys[kind]++
	}
	return r, nil
}
