package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/test/stack"
)

// pushedRecord is the shape of the record a writer keeps of its last push in Redis
// (internal/git/pushdelivery.go, P:pushed:<slot>:<branch>:<epoch>): the tip it made and the
// commit it built on.
type pushedRecord struct {
	SHA  string `json:"sha"`
	Base string `json:"base"`
}

// pushedObjects reads, from the commits of the push rec, the objects they carry: "<folder>
// <namespace>/<name>" (their change lines and Kubescribe-Folder trailers).
func pushedObjects(t *testing.T, repoDir string, rec pushedRecord) []string {
	t.Helper()
	span := rec.SHA
	if rec.Base != "" {
		span = rec.Base + ".." + rec.SHA
	}
	seen := map[string]bool{}
	var objects []string
	for _, commit := range strings.Split(gitCLI(t, repoDir, "log", "--format=%x00%B", span), "\x00")[1:] {
		folder := ""
		var keys []string
		for _, line := range strings.Split(commit, "\n") {
			if f, ok := strings.CutPrefix(line, "Kubescribe-Folder: /"); ok {
				folder = f
			}
			if m := changeLine.FindStringSubmatch(line); m != nil {
				keys = append(keys, m[2]+"/"+m[3])
			}
		}
		require.NotEmpty(t, folder, "a commit of the push names no folder: %s", commit)
		for _, k := range keys {
			if o := folder + " " + k; !seen[o] {
				seen[o] = true
				objects = append(objects, o)
			}
		}
	}
	return objects
}

// TestReplicasKilledBetweenPushAndCursorAdvance: the owner of a branch pushes, and is killed
// before it advances the resume cursors of what it pushed, a window of milliseconds that a
// SIGKILL, an OOM kill or a lost node can hit. The test makes that state exactly: the Git
// server refuses pushes while alice creates ConfigMaps and bob updates them, so that the
// owner's next push holds both versions of each; once it is in, the owner is killed and the
// cursors' advance of that push is undone in Redis, as if the kill had come first. The heir
// replays the events the cursors do not show pushed, and commits none of them again: no
// create is written back over bob's update, nothing is committed twice.
func TestReplicasKilledBetweenPushAndCursorAdvance(t *testing.T) {
	e := startReplicas(t, stack.Options{})
	tips := watchTips(t, e)
	ctx := context.Background()
	owner := e.s.Replica(branchOwner("b1", replicaNames))
	onB1 := e.targets[:2] // t1 and t2 write b1's folders f1 and f2
	clients := map[string]kubernetes.Interface{}
	for _, u := range []string{"alice", "bob"} {
		c, err := kubernetes.NewForConfig(e.s.UserConfig(u))
		require.NoError(t, err)
		clients[u] = c
	}
	var writes []aWrite
	// newest is each ConfigMap's version before the push under test: what the cursors may
	// show once its advance is undone.
	newest := map[string]aWrite{}
	write := func(user, ns, name, value string, update bool) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string]string{"v": value}}
		var err error
		if update {
			cm.ResourceVersion = newest[ns+"/"+name].rv
			cm, err = clients[user].CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
		} else {
			cm, err = clients[user].CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		}
		require.NoError(t, err)
		w := aWrite{user: user, ns: ns, name: name, rv: cm.ResourceVersion, value: value, update: update, at: time.Now()}
		writes = append(writes, w)
		newest[ns+"/"+name] = w
	}

	// Pushed, and the cursors advanced: alice's first ConfigMaps.
	for i := range 3 {
		for _, tg := range onB1 {
			write("alice", tg.ns, fmt.Sprintf("old-%d", i), "1", false)
		}
	}
	v := e.settle(t, writes, 2*time.Minute, nil)
	require.Zero(t, v.missing)
	before := map[string]aWrite{}
	for k, w := range newest {
		before[k] = w
	}

	// The push under test: while the Git server refuses, alice creates ConfigMaps and bob
	// updates them, and hers.
	e.s.Git.SetAvailable(false)
	for i := range 3 {
		for _, tg := range onB1 {
			write("alice", tg.ns, fmt.Sprintf("new-%d", i), "1", false)
		}
	}
	for k := range newest {
		ns, name, _ := strings.Cut(k, "/")
		write("bob", ns, name, "2", true)
	}
	// Every window is closed once the owner's push has failed after its commit window (1s)
	// ended: its next push holds all of them.
	errorsSample := `kubescribe_git_push_total{result="error"}`
	time.Sleep(1500 * time.Millisecond)
	m, err := owner.ScrapeMetrics()
	require.NoError(t, err)
	failed := m[errorsSample]
	require.True(t, poll(time.Minute, func() bool {
		m, err := owner.ScrapeMetrics()
		return err == nil && m[errorsSample] > failed
	}), "the owner of b1 tried no push while the Git server refused")
	e.s.Git.SetAvailable(true)
	v = e.settle(t, writes, 2*time.Minute, nil)
	require.Zero(t, v.missing)
	require.Zero(t, v.twice)

	// The owner dies; the advance of its last push is undone.
	killed := time.Now()
	require.NoError(t, owner.Kill())
	rdb := redis.NewClient(&redis.Options{Addr: e.s.RedisAddr})
	defer rdb.Close()
	// Each writer epoch keeps the record of its last push.
	tip := gitCLI(t, e.repoDir, "rev-parse", "refs/heads/b1")
	epoch := gitCLI(t, e.repoDir, "log", "-1", "--format=%(trailers:key=Kubescribe-Writer,valueonly)", "refs/heads/b1")
	_, epoch, _ = strings.Cut(epoch, " ")
	raw, err := rdb.Get(ctx, "kubescribe:pushed:"+replicasNS+"/repo:b1:"+epoch).Bytes()
	require.NoError(t, err, "the owner of b1 (writer %s) recorded no push", epoch)
	var rec pushedRecord
	require.NoError(t, json.Unmarshal(raw, &rec))
	require.Equal(t, tip, rec.SHA, "the record names the branch's tip")
	undone, twoVersions := 0, 0
	for _, o := range pushedObjects(t, e.repoDir, rec) {
		folder, key, _ := strings.Cut(o, " ")
		tg := onB1[0]
		if folder == onB1[1].folder {
			tg = onB1[1]
		}
		cursor := cursorKey(t, rdb, tg.name)
		if w, ok := before[key]; ok {
			uid := cursorUID(t, rdb, cursor, key)
			b, err := json.Marshal(map[string]any{"v": 1, "uid": uid, "rv": w.rv})
			require.NoError(t, err)
			require.NoError(t, rdb.HSet(ctx, cursor, key, b).Err())
		} else {
			require.NoError(t, rdb.HDel(ctx, cursor, key).Err())
			twoVersions++ // alice's create and bob's update
		}
		undone++
	}
	require.NotZero(t, twoVersions, "the last push held no object in two versions: %+v", rec)
	t.Logf("killed the owner of b1 after its push %s of %d objects (%d in two versions); their cursor advance undone", rec.SHA, undone, twoVersions)
	for _, tg := range onB1 {
		trail, _ := rdb.HGet(ctx, cursorKey(t, rdb, tg.name), "trail").Result()
		t.Logf("the trail of %s's stream: %s", tg.name, trail)
	}

	require.True(t, poll(90*time.Second, func() bool {
		return e.metric(t, "kubescribe_ownership_takeover_gap_seconds_count") >= 1
	}), "no survivor took b1 over")
	if !poll(3*time.Minute, func() bool {
		return e.metric(t, "kubescribe_git_replayed_duplicates_total") >= float64(twoVersions)
	}) {
		for _, name := range replicaNames {
			if name != owner.Name {
				logLines(t, e.s.Replica(name), "replay", "other writers of its slot", "already holds", "writes a branch now")
			}
		}
		t.Fatalf("the heir did not recognise the replayed versions as pushed; replays: %s", e.replays(t))
	}
	// Every write is in Git already: judge once the survivors hold no change, joined or not.
	quiet := 0
	require.True(t, poll(2*time.Minute, func() bool {
		if e.metric(t, "kubescribe_attribution_pending_changes")+e.metric(t, "kubescribe_git_pending_changes") > 0 {
			quiet = 0
			return false
		}
		quiet++
		return quiet >= 20 // 2s
	}), "the survivors still hold changes")
	logLines(t, e.s.Replica(branchOwner("b1", e.members())), "other writers of its slot", "already holds")
	v = e.settle(t, writes, time.Minute, nil)
	t.Logf("after the kill: %s; replays: %s; %.0f replayed changes recognised as pushed",
		v, e.replays(t), e.metric(t, "kubescribe_git_replayed_duplicates_total"))
	requireNoneLost(t, v, killed)
	require.Zero(t, v.twice, "changes committed twice")
	require.Zero(t, v.wrong, "changes credited to the wrong user")
	e.requireFinalState(t, writes)
	tips.requireNoForcePush(t, e)
}

// cursorKey is the one resume cursor of GitTarget target (ConfigMaps of one namespace).
func cursorKey(t *testing.T, rdb *redis.Client, target string) string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), "kubescribe:cursor:*:"+replicasNS+"/"+target+":*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1, "cursors of %s", target)
	return keys[0]
}

// cursorUID is the UID a cursor holds for object key.
func cursorUID(t *testing.T, rdb *redis.Client, cursor, key string) string {
	t.Helper()
	raw, err := rdb.HGet(context.Background(), cursor, key).Bytes()
	require.NoError(t, err, "%s holds no %s", cursor, key)
	var rec struct {
		UID string `json:"uid"`
	}
	require.NoError(t, json.Unmarshal(raw, &rec))
	return rec.UID
}
