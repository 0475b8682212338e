package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/ownership"
	"github.com/kubescribe/kubescribe/test/stack"
)

// Several replicas of kubescribe, as the Deployment runs them: three processes of the server
// binary on one real apiserver, Redis and Git server, behind balancers that stand in for the
// audit and admission Services, coordinating through Leases with their defaults (15s). One
// repository, three branches, six GitTargets (two per branch, each a folder of its own), each
// mirroring the ConfigMaps of a namespace of its own through a ClusterWatchRule; alice, bob and
// carol write there throughout.

const replicasNS = "replicas"

var replicaNames = []string{"kubescribe-a", "kubescribe-b", "kubescribe-c"}

// replicaTarget is one of the six GitTargets: it mirrors namespace ns into folder of branch.
type replicaTarget struct{ name, branch, folder, ns string }

type replicaEnv struct {
	s       *stack.Stack
	repoDir string
	targets []replicaTarget
}

// startReplicas starts a stack of the test's own with three replicas and the six targets, and
// waits until every rule is Ready.
func startReplicas(t *testing.T, opts stack.Options) *replicaEnv {
	t.Helper()
	return startReplicasOn(t, startStack(t, opts), replicaNames...)
}

// startReplicasOn is startReplicas on the stack s, with the replicas names.
func startReplicasOn(t *testing.T, s *stack.Stack, names ...string) *replicaEnv {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.StartReplicas(ctx, binary(t, "./cmd/server", "kubescribe-server"), names...))
	admin, err := kubernetes.NewForConfig(s.AdminConfig)
	require.NoError(t, err)
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: replicasNS}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m := newRepoProvider(t, s, admin, replicasNS, time.Second)
	e := &replicaEnv{s: s, repoDir: m.repoDir}
	writers := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update", "get"}}}
	for i := range 6 {
		tg := replicaTarget{name: fmt.Sprintf("t%d", i+1), branch: fmt.Sprintf("b%d", i/2+1), folder: fmt.Sprintf("f%d", i+1), ns: fmt.Sprintf("replicas-w%d", i+1)}
		e.targets = append(e.targets, tg)
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tg.ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
		bindRole(t, admin, tg.ns, "writers", writers, "alice", "bob", "carol")
		createOn(t, s.AdminConfig, v1alpha1.GitTargetsResource, replicasNS, &v1alpha1.GitTarget{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
			ObjectMeta: metav1.ObjectMeta{Name: tg.name, Namespace: replicasNS},
			Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: tg.branch, Path: tg.folder},
		})
		createOn(t, s.AdminConfig, v1alpha1.ClusterWatchRulesResource, "", &v1alpha1.ClusterWatchRule{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "ClusterWatchRule"},
			ObjectMeta: metav1.ObjectMeta{Name: "replicas-" + tg.name},
			Spec: v1alpha1.ClusterWatchRuleSpec{
				TargetRef:  v1alpha1.NamespacedObjectReference{Namespace: replicasNS, Name: tg.name},
				Namespaces: []string{tg.ns},
				Rules:      []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}}},
			},
		})
	}
	for _, tg := range e.targets {
		waitReadyOn(t, s.AdminConfig, v1alpha1.ClusterWatchRulesResource, "", "replicas-"+tg.name, metav1.ConditionTrue, v1alpha1.ReasonReady)
	}
	return e
}

// owner is the replica that owns branch among members.
func branchOwner(branch string, members []string) string {
	return ownership.OwnerOf(replicasNS+"/repo:"+branch, members)
}

// aWrite is one write the load made: who wrote which version of which ConfigMap, and its data.
type aWrite struct {
	user, ns, name, rv, value string
	update                    bool
	at                        time.Time
}

// replicaLoad writes ConfigMaps into the six namespaces at about rate writes a second, as
// alice, bob and carol in turn, until stopped: creates, and every fourth write an update, by
// another user than its creator, of a ConfigMap created at least two seconds before and never
// updated. Each version is thus one write by one user, which Git must show exactly once, by
// that user.
type replicaLoad struct {
	t      *testing.T
	e      *replicaEnv
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	writes []aWrite
	errs   int
}

func startLoad(t *testing.T, e *replicaEnv, rate int) *replicaLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &replicaLoad{t: t, e: e, cancel: cancel, done: make(chan struct{})}
	users := []string{"alice", "bob", "carol"}
	clients := map[string]kubernetes.Interface{}
	for _, u := range users {
		cfg := e.s.UserConfig(u)
		cfg.QPS, cfg.Burst = float32(rate), rate
		c, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		clients[u] = c
	}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		type created struct {
			aWrite
			at time.Time
		}
		var fresh []created
		// A write is never cancelled half-way: the apiserver may have made it when its answer
		// is lost, and the load would not know what it wrote. Stopping ends the loop instead.
		write := context.WithoutCancel(ctx)
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			user := users[i%len(users)]
			value := fmt.Sprint(i)
			if i%4 == 3 && len(fresh) > 0 && time.Since(fresh[0].at) > 2*time.Second {
				c := fresh[0]
				fresh = fresh[1:]
				if c.user == user {
					user = users[(i+1)%len(users)]
				}
				cm, err := clients[user].CoreV1().ConfigMaps(c.ns).Update(write, &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: c.ns, ResourceVersion: c.rv}, Data: map[string]string{"v": value}}, metav1.UpdateOptions{})
				l.record(cm, err, aWrite{user: user, ns: c.ns, name: c.name, value: value, update: true})
				continue
			}
			tg := e.targets[i%len(e.targets)]
			name := fmt.Sprintf("cm-%05d", i)
			cm, err := clients[user].CoreV1().ConfigMaps(tg.ns).Create(write, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": value}}, metav1.CreateOptions{})
			if w, ok := l.record(cm, err, aWrite{user: user, ns: tg.ns, name: name, value: value}); ok {
				fresh = append(fresh, created{aWrite: w, at: time.Now()})
			}
		}
	}()
	t.Cleanup(l.stop)
	return l
}

func (l *replicaLoad) record(cm *corev1.ConfigMap, err error, w aWrite) (aWrite, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if !strings.Contains(err.Error(), "context canceled") {
			l.errs++
			l.t.Logf("write %s/%s by %s: %v", w.ns, w.name, w.user, err)
		}
		return w, false
	}
	w.rv, w.at = cm.ResourceVersion, time.Now()
	l.writes = append(l.writes, w)
	return w, true
}

// stop ends the load and returns what it wrote.
func (l *replicaLoad) stop() {
	l.cancel()
	<-l.done
}

func (l *replicaLoad) written() []aWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

// committedChange is one change line of a commit on a branch.
type committedChange struct {
	branch, commit, author, ns, name, rv string
}

var changeLine = regexp.MustCompile(`^(create|update|delete) core/configmaps (\S+)/(\S+) resourceVersion=(\d+)( uid=\S+)?$`)

// history reads every commit of the three branches: their change lines, and the commits
// attributed to nobody (unresolved) or to the committer (a snapshot).
func (e *replicaEnv) history(t *testing.T) (changes []committedChange, unresolved, snapshots int) {
	t.Helper()
	for _, b := range []string{"b1", "b2", "b3"} {
		out, err := exec.Command("git", "--git-dir", e.repoDir, "log", "--format=%x00%H%n%an%n%B", b, "--").CombinedOutput()
		if err != nil {
			continue // not created yet
		}
		for _, c := range strings.Split(string(out), "\x00")[1:] {
			lines := strings.Split(c, "\n")
			sha, author := lines[0], lines[1]
			for _, line := range lines[2:] {
				switch {
				case line == "Kubescribe-Attribution: unresolved":
					unresolved++
				case line == "Kubescribe-Attribution: snapshot":
					snapshots++
				}
				if m := changeLine.FindStringSubmatch(line); m != nil {
					changes = append(changes, committedChange{branch: b, commit: sha, author: author, ns: m[2], name: m[3], rv: m[4]})
				}
			}
		}
	}
	return changes, unresolved, snapshots
}

// verdict compares what the load wrote with what Git holds, once every write is there (or the
// wait ends): each version exactly once, by its writer.
type verdict struct {
	// wrong counts changes credited to another user than their writer; unresolved, commits
	// credited to nobody ("unknown (attribution unresolved)").
	writes, missing, twice, wrong, unresolved, snapshots, foreign int
	// lost are the writes in no commit.
	lost []aWrite
}

// settle waits until every write is in Git, or until only the writes excused allows are
// missing and have been for a while (nothing more is coming), at most within; then judges.
func (e *replicaEnv) settle(t *testing.T, writes []aWrite, within time.Duration, excused func(aWrite) bool) verdict {
	t.Helper()
	var since time.Time
	poll(within, func() bool {
		v := e.judge(t, writes, false)
		if v.missing == 0 {
			return true
		}
		for _, w := range v.lost {
			if excused == nil || !excused(w) {
				since = time.Time{}
				return false
			}
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) > 20*time.Second
	})
	return e.judge(t, writes, true)
}

func (e *replicaEnv) judge(t *testing.T, writes []aWrite, log bool) verdict {
	changes, unresolved, snapshots := e.history(t)
	seen := map[string][]committedChange{}
	for _, c := range changes {
		k := c.ns + "/" + c.name + "@" + c.rv
		seen[k] = append(seen[k], c)
	}
	v := verdict{writes: len(writes), unresolved: unresolved, snapshots: snapshots}
	mine := map[string]bool{}
	for _, w := range writes {
		k := w.ns + "/" + w.name + "@" + w.rv
		mine[k] = true
		cs := seen[k]
		switch {
		case len(cs) == 0:
			v.missing++
			v.lost = append(v.lost, w)
			if v.missing <= 10 && log {
				t.Logf("%s (%s by %s at %s) is in no commit", k, map[bool]string{true: "update", false: "create"}[w.update], w.user, w.at.Format("15:04:05.000"))
			}
		case len(cs) > 1:
			v.twice++
			if log {
				t.Logf("%s committed %d times: %+v", k, len(cs), cs)
			}
		}
		for _, c := range cs {
			if strings.HasPrefix(c.author, "unknown") {
				continue // unresolved: counted by its commit's trailer, never another's
			}
			if c.author != w.user {
				v.wrong++
				if log {
					t.Logf("%s written by %s, committed as %s's (%s on %s)", k, w.user, c.author, c.commit, c.branch)
				}
			}
		}
	}
	for k := range seen {
		if !mine[k] {
			v.foreign++
		}
	}
	return v
}

// requireFinalState checks that each folder holds each ConfigMap with the value last written.
func (e *replicaEnv) requireFinalState(t *testing.T, writes []aWrite) {
	t.Helper()
	last := map[string]aWrite{}
	for _, w := range writes {
		last[w.ns+"/"+w.name] = w
	}
	byNS := map[string]replicaTarget{}
	for _, tg := range e.targets {
		byNS[tg.ns] = tg
	}
	for k, w := range last {
		tg := byNS[w.ns]
		path := fmt.Sprintf("%s:%s/%s/core/configmaps/%s.yaml", tg.branch, tg.folder, w.ns, w.name)
		out, err := exec.Command("git", "--git-dir", e.repoDir, "show", path).CombinedOutput()
		require.NoError(t, err, "%s: %s", k, out)
		require.Contains(t, string(out), fmt.Sprintf("v: %q", w.value), "%s holds an older version", path)
	}
}

// members are the replicas that run.
func (e *replicaEnv) members() []string {
	var out []string
	for _, n := range replicaNames {
		if r := e.s.Replica(n); r != nil && r.Running() {
			out = append(out, n)
		}
	}
	return out
}

// metric sums a sample over the running replicas.
func (e *replicaEnv) metric(t *testing.T, sample string) float64 {
	t.Helper()
	var sum float64
	for _, n := range e.members() {
		m, err := e.s.Replica(n).ScrapeMetrics()
		require.NoError(t, err)
		sum += m[sample]
	}
	return sum
}

// tips records the tips of the three branches over time, so that a test can check that every
// tip it saw is in the final history: nothing was force-pushed away.
type tips struct {
	mu     sync.Mutex
	seen   map[string]map[string]bool
	cancel context.CancelFunc
	done   chan struct{}
}

func watchTips(t *testing.T, e *replicaEnv) *tips {
	ctx, cancel := context.WithCancel(context.Background())
	tp := &tips{seen: map[string]map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tp.done)
		for ctx.Err() == nil {
			for _, b := range []string{"b1", "b2", "b3"} {
				out, err := exec.Command("git", "--git-dir", e.repoDir, "rev-parse", "--verify", "-q", "refs/heads/"+b).Output()
				if err != nil {
					continue
				}
				tp.mu.Lock()
				if tp.seen[b] == nil {
					tp.seen[b] = map[string]bool{}
				}
				tp.seen[b][strings.TrimSpace(string(out))] = true
				tp.mu.Unlock()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-tp.done })
	return tp
}

// requireNoForcePush checks that every tip seen is an ancestor of its branch's tip now.
func (tp *tips) requireNoForcePush(t *testing.T, e *replicaEnv) {
	t.Helper()
	tp.cancel()
	<-tp.done
	n := 0
	for b, shas := range tp.seen {
		for sha := range shas {
			err := exec.Command("git", "--git-dir", e.repoDir, "merge-base", "--is-ancestor", sha, "refs/heads/"+b).Run()
			require.NoError(t, err, "tip %s of %s is no longer in its history: it was pushed over", sha, b)
			n++
		}
	}
	t.Logf("%d tips seen, each in the final history of its branch", n)
}

func (v verdict) String() string {
	return fmt.Sprintf("%d writes: %d missing, %d committed twice, %d wrong authors, %d unresolved commits, %d snapshot commits, %d change lines of no write",
		v.writes, v.missing, v.twice, v.wrong, v.unresolved, v.snapshots, v.foreign)
}

// TestReplicasKilledOwnerHandsOver: the owner of a branch is killed (SIGKILL) while the three
// users write; the others take its branches over once its Lease expires, from the resume
// cursors, and replay the events since the position the killed owner last recorded, so that
// the versions it held unpushed are committed too. Nothing is lost, nothing is committed twice
// or credited to the wrong user, and every object ends as the cluster holds it.
func TestReplicasKilledOwnerHandsOver(t *testing.T) {
	e := startReplicas(t, stack.Options{})
	tips := watchTips(t, e)
	load := startLoad(t, e, 20)
	time.Sleep(5 * time.Second) // the scenario: writes under way before the kill

	victim := branchOwner("b1", replicaNames)
	killed := time.Now()
	require.NoError(t, e.s.Replica(victim).Kill())
	t.Logf("killed %s, owner of b1 (and of %v)", victim, ownedBy(victim, replicaNames))
	survivors := e.members()
	heir := branchOwner("b1", survivors)
	require.True(t, poll(60*time.Second, func() bool {
		return e.metric(t, "kubescribe_ownership_takeover_gap_seconds_count") >= 1
	}), "no survivor took a branch of %s over", victim)
	t.Logf("%s took b1 over %s after the kill; takeover gaps (last sign of life to takeover) sum %.1fs over %.0f branches",
		heir, time.Since(killed).Round(100*time.Millisecond),
		e.metric(t, "kubescribe_ownership_takeover_gap_seconds_sum"), e.metric(t, "kubescribe_ownership_takeover_gap_seconds_count"))
	time.Sleep(10 * time.Second) // writes go on under the new owners
	load.stop()

	writes := load.written()
	v := e.settle(t, writes, 3*time.Minute, nil)
	t.Logf("after the kill: %s; replays: %s", v, e.replays(t))
	requireNoneLost(t, v, killed)
	require.Zero(t, v.twice, "changes committed twice")
	require.Zero(t, v.wrong, "changes credited to the wrong user")
	require.Zero(t, v.foreign)
	e.requireFinalState(t, load.written())
	tips.requireNoForcePush(t, e)
	require.Zero(t, load.errs)
}

// requireNoneLost fails on any write no commit holds: the heir replays the events since the
// lost owner's last recorded position, so even the versions it held unpushed, or that were
// overwritten before the takeover, are committed.
func requireNoneLost(t *testing.T, v verdict, lostAt time.Time) {
	t.Helper()
	for _, w := range v.lost {
		t.Errorf("%s/%s@%s (%s, %s before the owner was lost) is in no commit", w.ns, w.name, w.rv, w.user, lostAt.Sub(w.at).Round(10*time.Millisecond))
	}
	require.Zero(t, v.missing, "changes lost")
}

// replays sums kubescribe_watch_replays_total by result over the live replicas.
func (e *replicaEnv) replays(t *testing.T) string {
	sums := map[string]float64{}
	for _, name := range e.members() {
		m, err := e.s.Replica(name).ScrapeMetrics()
		if err != nil {
			continue
		}
		for k, val := range m {
			if strings.HasPrefix(k, "kubescribe_watch_replays_total{") {
				sums[k[strings.Index(k, "result="):len(k)-1]] += val
			}
		}
	}
	return fmt.Sprint(sums)
}

// ownedBy lists the branches replica owns among members.
func ownedBy(replica string, members []string) []string {
	var out []string
	for _, b := range []string{"b1", "b2", "b3"} {
		if branchOwner(b, members) == replica {
			out = append(out, b)
		}
	}
	return out
}

// TestReplicasRollingRestartKeepsEveryAuthor: all three replicas are restarted one at a time
// (SIGTERM; the next once the previous is Ready again), as a rolling update does, while the
// users write about 50 times a second. The audit endpoint never goes away, so every change
// keeps its author: none lost, none wrong and none unresolved.
func TestReplicasRollingRestartKeepsEveryAuthor(t *testing.T) {
	e := startReplicas(t, stack.Options{})
	tips := watchTips(t, e)
	load := startLoad(t, e, 60)
	time.Sleep(3 * time.Second) // the scenario: writes under way before the restarts
	ctx := context.Background()
	began := time.Now()
	for _, name := range replicaNames {
		stopped := time.Now()
		require.NoError(t, e.s.Replica(name).Stop())
		_, err := e.s.StartReplica(ctx, name)
		require.NoError(t, err)
		t.Logf("%s restarted in %s", name, time.Since(stopped).Round(100*time.Millisecond))
	}
	t.Logf("rolling restart of %d replicas took %s", len(replicaNames), time.Since(began).Round(100*time.Millisecond))
	time.Sleep(5 * time.Second) // the scenario: writes go on after the last restart
	load.stop()

	writes := load.written()
	v := e.settle(t, writes, 3*time.Minute, nil)
	t.Logf("after the rolling restart: %s (%.0f writes/s)", v, float64(len(writes))/time.Since(began.Add(-3*time.Second)).Seconds())
	require.Zero(t, v.missing, "changes lost")
	require.Zero(t, v.twice, "changes committed twice")
	require.Zero(t, v.wrong, "changes credited to the wrong user")
	require.Zero(t, v.unresolved, "changes without their author")
	e.requireFinalState(t, writes)
	tips.requireNoForcePush(t, e)
	require.Zero(t, load.errs)
}

// TestReplicasThatBothBelieveTheyOwnABranch: the owner of a branch is paused (SIGSTOP) longer
// than its Lease, with changes in its open commit window; another replica takes the branch over
// and writes on. When the paused one goes on, it still believes it owns the branch for a
// moment, and its worker holds an older state: it must find the newer writer's commits and give
// up, never force-pushing and never committing a change twice. Then it joins again and takes
// its branches back.
func TestReplicasThatBothBelieveTheyOwnABranch(t *testing.T) {
	e := startReplicas(t, stack.Options{})
	tips := watchTips(t, e)
	load := startLoad(t, e, 20)
	time.Sleep(4 * time.Second) // the scenario: writes under way before the pause

	paused := branchOwner("b1", replicaNames)
	r := e.s.Replica(paused)
	require.NoError(t, r.Pause())
	pausedAt := time.Now()
	t.Logf("paused %s, owner of %v", paused, ownedBy(paused, replicaNames))
	others := slices.DeleteFunc(slices.Clone(replicaNames), func(n string) bool { return n == paused })
	heir := branchOwner("b1", others)
	require.True(t, poll(60*time.Second, func() bool {
		m, err := e.s.Replica(heir).ScrapeMetrics()
		return err == nil && m["kubescribe_ownership_members"] == 2 && m["kubescribe_ownership_takeover_gap_seconds_count"] >= 1
	}), "%s did not take b1 over", heir)
	time.Sleep(8 * time.Second) // the heir writes b1 while the owner sleeps
	require.NoError(t, r.Resume())
	t.Logf("resumed %s", paused)
	require.True(t, poll(60*time.Second, func() bool {
		m, err := r.ScrapeMetrics()
		return err == nil && m["kubescribe_ownership_members"] == 3
	}), "%s did not join again", paused)
	time.Sleep(8 * time.Second) // the scenario: writes go on while both may write b1
	load.stop()

	writes := load.written()
	v := e.settle(t, writes, 3*time.Minute, nil)
	m, err := r.ScrapeMetrics()
	require.NoError(t, err)
	t.Logf("after the overlap: %s; %s superseded %.0f times; replays: %s", v, paused, m["kubescribe_git_writer_superseded_total"], e.replays(t))
	for _, name := range replicaNames {
		logLines(t, e.s.Replica(name), "writes a branch again", "other writers of its slot", "already holds", "someone else's commits",
			"took this branch over", "found a newer one there", "writes a branch now", "stopped writing", "rebuilding unpushed", "hand their state over")
	}
	// The two writers never force-push and never commit a change twice or under the wrong
	// name, and nothing is lost. When the paused replica comes back and takes its branch again,
	// the heir lets the branch go and drops the changes still waiting for their authors (their
	// audit batches were stuck on the paused replica's connection); the replica that comes back
	// replays its streams from their trail, since its worker was superseded or it let the
	// branch go meanwhile, and leaves out what the heir's last push delivered. Every object
	// ends as the cluster holds it.
	for _, w := range v.lost {
		t.Logf("%s/%s@%s (%s, %s after the pause) is in no commit", w.ns, w.name, w.rv, w.user, w.at.Sub(pausedAt).Round(10*time.Millisecond))
	}
	require.Zero(t, v.missing, "changes lost")
	require.Zero(t, v.twice, "changes committed twice")
	require.Zero(t, v.wrong, "changes credited to the wrong user")
	e.requireFinalState(t, writes)
	tips.requireNoForcePush(t, e)
}

// TestReplicasWithoutLeasesWriteEachVersionOnce: exactly once does not rest on the Leases. Two replicas
// run without them (--coordination=none: each writes every branch), so both write each branch
// for the whole minute that alice, bob and carol write, each building on, or giving way to, the
// other's commits. Git holds each version once, by its writer, every object ends as the cluster
// holds it, and no tip is ever pushed over.
func TestReplicasWithoutLeasesWriteEachVersionOnce(t *testing.T) {
	s := startStack(t, stack.Options{ReplicaArgs: []string{"--coordination=none"}})
	e := startReplicasOn(t, s, "kubescribe-a", "kubescribe-b")
	tips := watchTips(t, e)
	load := startLoad(t, e, 20)
	time.Sleep(time.Minute) // the scenario: a minute of writes while both replicas write every branch
	load.stop()

	writes := load.written()
	v := e.settle(t, writes, 3*time.Minute, nil)
	commits := map[string]float64{}
	for _, name := range []string{"kubescribe-a", "kubescribe-b"} {
		m, err := e.s.Replica(name).ScrapeMetrics()
		require.NoError(t, err)
		commits[name] = m["kubescribe_git_commits_total"]
	}
	t.Logf("two writers for a minute: %s; commits by replica %v", v, commits)
	require.Zero(t, v.missing, "changes lost")
	require.Zero(t, v.twice, "changes committed twice")
	require.Zero(t, v.wrong, "changes credited to the wrong user")
	for name, n := range commits {
		require.NotZero(t, n, "%s never wrote: the overlap did not happen", name)
	}
	e.requireFinalState(t, writes)
	tips.requireNoForcePush(t, e)
}

// TestReplicasSentinelFailover: the three replicas reach Redis through Sentinel and the master
// is failed over (SENTINEL FAILOVER) while the users write: nothing is lost, nothing committed
// twice, nothing credited to the wrong user. A fact the old master took but had not passed to
// the replica when it was demoted is gone with it (Redis replicates asynchronously): its change
// may be unresolved, never another's; so may a cursor's advance, which only replays a change.
func TestReplicasSentinelFailover(t *testing.T) {
	e := startReplicas(t, stack.Options{RedisSentinel: true})
	tips := watchTips(t, e)
	load := startLoad(t, e, 20)
	time.Sleep(5 * time.Second) // the scenario: writes under way before the failover
	ctx := context.Background()
	old, err := e.s.Sentinel.Master(ctx)
	require.NoError(t, err)
	began := time.Now()
	master, err := e.s.Sentinel.Failover(ctx)
	require.NoError(t, err)
	t.Logf("failover: the Sentinel announced %s instead of %s after %s", master, old, time.Since(began).Round(time.Millisecond))
	time.Sleep(10 * time.Second) // the scenario: writes go on under the new master
	load.stop()

	writes := load.written()
	v := e.settle(t, writes, 3*time.Minute, nil)
	t.Logf("after the failover: %s", v)
	require.Zero(t, v.missing, "changes lost")
	require.Zero(t, v.twice, "changes committed twice")
	require.Zero(t, v.wrong, "changes credited to another user")
	e.requireFinalState(t, writes)
	tips.requireNoForcePush(t, e)
}

// logLines logs the lines of replica's log that hold one of the phrases.
func logLines(t *testing.T, replica *stack.Replica, phrases ...string) {
	t.Helper()
	out, err := os.ReadFile(replica.LogPath)
	if err != nil {
		t.Logf("%s: %v", replica.Name, err)
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		for _, p := range phrases {
			if strings.Contains(line, p) {
				t.Logf("%s: %s", replica.Name, line)
				break
			}
		}
	}
}
