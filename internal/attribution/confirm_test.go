package attribution

import (
	"context"
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// fakeCandidates is an in-memory candidateSource; add announces through facts.
type fakeCandidates struct {
	mu    sync.Mutex
	cands map[string][]StoredCandidate // "<route>/<uid>/<base>"
	facts *fakeFacts
}

func (f *fakeCandidates) add(route, uid, base string, c StoredCandidate) {
	f.mu.Lock()
	if f.cands == nil {
		f.cands = map[string][]StoredCandidate{}
	}
	k := route + "/" + uid + "/" + base
	f.cands[k] = append(f.cands[k], c)
	f.mu.Unlock()
	f.facts.announce <- route + "/" + uid
}

func (f *fakeCandidates) Candidates(_ context.Context, route, uid, base string) ([]StoredCandidate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]StoredCandidate(nil), f.cands[route+"/"+uid+"/"+base]...), nil
}

func startSourceJoiner(t *testing.T, src Source, grace time.Duration) (*Joiner, *fakeFacts, *fakeCandidates, chan AttributedChange) {
	t.Helper()
	facts := newFakeFacts()
	cands := &fakeCandidates{facts: facts}
	j, err := NewJoiner(JoinerOptions{Facts: facts, Candidates: cands, Grace: grace, Source: src})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = j.Run(ctx) }()
	return j, facts, cands, make(chan AttributedChange, 16)
}

var manifestV2 = []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  k: v2\n")

func live(op watch.Op, base string, manifest []byte) watch.Change {
	c := watch.Change{Cluster: "local", UID: "u1", Name: "app", ResourceVersion: "9", Op: op, BaseResourceVersion: base, Manifest: manifest}
	if manifest != nil {
		c.Digest = sha256.Sum256(manifest)
	}
	return c
}

func cand(user, op, digest string) StoredCandidate {
	return StoredCandidate{Operation: op, Digest: digest, User: audit.Identity{Username: user}}
}

func await(t *testing.T, out chan AttributedChange) AttributedChange {
	t.Helper()
	select {
	case a := <-out:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no change emitted")
		return AttributedChange{}
	}
}

func TestConfirmedCandidateNamesTheAuthor(t *testing.T) {
	j, _, cands, out := startSourceJoiner(t, SourceAdmission, time.Minute)
	digest := admission.Digest(manifestV2)
	// A candidate from another base, and one with other content, confirm nothing.
	cands.add("local", "u1", "7", cand("mallory", admission.OpUpdate, digest))
	cands.add("local", "u1", "8", cand("eve", admission.OpUpdate, admission.Digest([]byte("other"))))
	j.Join(live(watch.OpUpdate, "8", manifestV2), func(a AttributedChange) { out <- a })
	select {
	case a := <-out:
		t.Fatalf("emitted before a matching candidate: %+v", a.Author)
	case <-time.After(100 * time.Millisecond):
	}
	cands.add("local", "u1", "8", cand("bob", admission.OpUpdate, digest)) // woken by its announcement
	a := await(t, out)
	require.True(t, a.Author.Resolved)
	require.Equal(t, "bob", a.Author.Username)
	require.Equal(t, "admission", a.Author.Source)
	require.Equal(t, "update", a.Author.Verb)
}

func TestConfirmCreateDeleteAndScale(t *testing.T) {
	j, _, cands, out := startSourceJoiner(t, SourceAdmission, time.Minute)
	emit := func(a AttributedChange) { out <- a }
	digest := admission.Digest(manifestV2)

	cands.add("local", "u1", "", cand("alice", admission.OpCreate, digest))
	j.Join(live(watch.OpCreate, "", manifestV2), emit)
	require.Equal(t, "alice", await(t, out).Author.Username)

	// A delete held by finalizers: the DELETE started from the version before
	// deletionTimestamp; the finalizer-removing UPDATE from the last one never matches a delete.
	cands.add("local", "u1", "11", cand("ci", admission.OpUpdate, digest))
	cands.add("local", "u1", "10", cand("bob", admission.OpDelete, ""))
	del := live(watch.OpDelete, "11", nil)
	del.DeletionBaseResourceVersion = "10"
	j.Join(del, emit)
	a := await(t, out)
	require.Equal(t, "bob", a.Author.Username)
	require.Equal(t, "delete", a.Author.Verb)

	// Scale: the candidate carries replicas, compared with the new object's spec.replicas.
	deploy := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 3\n")
	three, two := int64(3), int64(2)
	cands.add("local", "u2", "20", StoredCandidate{Operation: admission.OpUpdate, Subresource: "scale", Replicas: &two, User: audit.Identity{Username: "eve"}})
	cands.add("local", "u2", "20", StoredCandidate{Operation: admission.OpUpdate, Subresource: "scale", Replicas: &three, User: audit.Identity{Username: "carol"}})
	sc := live(watch.OpUpdate, "20", deploy)
	sc.UID = "u2"
	j.Join(sc, emit)
	require.Equal(t, "carol", await(t, out).Author.Username)
}

func TestCandidatesOfTwoUsersAreUnresolved(t *testing.T) {
	j, _, cands, out := startSourceJoiner(t, SourceAdmission, time.Minute)
	digest := admission.Digest(manifestV2)
	cands.add("local", "u1", "8", cand("bob", admission.OpUpdate, digest))
	cands.add("local", "u1", "8", cand("bob", admission.OpUpdate, digest)) // a retry: still one user
	cands.add("local", "u1", "8", cand("mallory", admission.OpUpdate, digest))
	j.Join(live(watch.OpUpdate, "8", manifestV2), func(a AttributedChange) { out <- a })
	a := await(t, out)
	require.False(t, a.Author.Resolved)
	require.Equal(t, UnresolvedUsername, a.Author.Username)
}

// A second user's candidate of the same write stored just after the write was watched (its
// webhook call slower than the first user's) still makes it ambiguous: a confirmation by one
// user waits DefaultCandidateSettle after the event before it is final.
func TestACandidateRecordedJustAfterTheEventStillCounts(t *testing.T) {
	j, _, cands, out := startSourceJoiner(t, SourceAdmission, time.Minute)
	digest := admission.Digest(manifestV2)
	cands.add("local", "u1", "8", cand("mallory", admission.OpUpdate, digest))
	c := live(watch.OpUpdate, "8", manifestV2)
	c.Observed = time.Now()
	j.Join(c, func(a AttributedChange) { out <- a })
	select {
	case a := <-out:
		t.Fatalf("emitted before the candidates settled: %+v", a.Author)
	case <-time.After(DefaultCandidateSettle / 4):
	}
	cands.add("local", "u1", "8", cand("bob", admission.OpUpdate, digest))
	a := await(t, out)
	require.False(t, a.Author.Resolved, "credited to %s", a.Author.Username)
	require.Equal(t, UnresolvedUsername, a.Author.Username)
}

// The settle is counted from the change's event, not from Join: a change seen settle ago is
// credited at once (here a settle of an hour: await gives up after seconds).
func TestCandidateSettleCountsFromTheEvent(t *testing.T) {
	facts := newFakeFacts()
	cands := &fakeCandidates{facts: facts}
	j, err := NewJoiner(JoinerOptions{Facts: facts, Candidates: cands, Grace: 2 * time.Hour, CandidateSettle: time.Hour, Source: SourceAdmission})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = j.Run(ctx) }()
	out := make(chan AttributedChange, 1)
	cands.add("local", "u1", "8", cand("bob", admission.OpUpdate, admission.Digest(manifestV2)))
	c := live(watch.OpUpdate, "8", manifestV2)
	c.Observed = time.Now().Add(-time.Hour)
	j.Join(c, func(a AttributedChange) { out <- a })
	require.Equal(t, "bob", await(t, out).Author.Username)
}

func TestUnconfirmedIsUnresolvedAfterGrace(t *testing.T) {
	j, _, _, out := startSourceJoiner(t, SourceAdmission, 50*time.Millisecond)
	j.Join(live(watch.OpUpdate, "8", manifestV2), func(a AttributedChange) { out <- a })
	require.False(t, await(t, out).Author.Resolved)
	// A listed change has no base: nothing confirms it, and it is the committer's snapshot.
	c := live(watch.OpCreate, "", manifestV2)
	c.Snapshot = true
	j.Join(c, func(a AttributedChange) { out <- a })
	a := await(t, out)
	require.False(t, a.Author.Resolved)
	require.NotEqual(t, UnresolvedUsername, a.Author.Username)
}

// With both sources the audit fact wins, even over a candidate that is already confirmed;
// without a fact the candidate names the author once the grace window ends.
func TestBothSourcesAuditWins(t *testing.T) {
	j, facts, cands, out := startSourceJoiner(t, SourceBoth, 300*time.Millisecond)
	emit := func(a AttributedChange) { out <- a }
	digest := admission.Digest(manifestV2)
	cands.add("local", "u1", "8", cand("mallory", admission.OpUpdate, digest))
	j.Join(live(watch.OpUpdate, "8", manifestV2), emit)
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "9", Verb: "patch", User: audit.Identity{Username: "bob"}}, false)
	a := await(t, out)
	require.Equal(t, "bob", a.Author.Username)
	require.Equal(t, "audit", a.Author.Source)

	c := live(watch.OpUpdate, "8", manifestV2)
	c.UID = "u3"
	cands.add("local", "u3", "8", cand("alice", admission.OpUpdate, digest))
	j.Join(c, emit)
	a = await(t, out)
	require.Equal(t, "alice", a.Author.Username)
	require.Equal(t, "admission", a.Author.Source)
}

// The source is per cluster: a cluster set to audit ignores candidates.
func TestSourceIsPerCluster(t *testing.T) {
	j, _, cands, out := startSourceJoiner(t, SourceAdmission, 100*time.Millisecond)
	j.SetSource("remote", SourceAudit)
	digest := admission.Digest(manifestV2)
	cands.add("remote", "u1", "8", cand("bob", admission.OpUpdate, digest))
	c := live(watch.OpUpdate, "8", manifestV2)
	c.Cluster = "remote"
	j.Join(c, func(a AttributedChange) { out <- a })
	require.False(t, await(t, out).Author.Resolved)
}

func TestJoinerSourceOptions(t *testing.T) {
	_, err := NewJoiner(JoinerOptions{Facts: newFakeFacts(), Source: SourceAdmission})
	require.ErrorContains(t, err, "Candidates is required")
	_, err = NewJoiner(JoinerOptions{Facts: newFakeFacts(), Source: "guess"})
	require.ErrorContains(t, err, `"guess" is not one of audit, admission, both`)
}

// On a cluster whose authors come from audit facts, a sealed Secret's update (its audit event
// names no post-write version) is credited by the candidate with the same keyed digest; an
// unsealed change there never reads candidates.
func TestSealedSecretOnAnAuditClusterIsConfirmedByItsCandidate(t *testing.T) {
	j, _, cands, out := startSourceJoiner(t, SourceAudit, time.Minute) // confirmed at once: no fact can come
	keyed := sha256.Sum256([]byte("keyed digest of the plaintext"))
	c := live(watch.OpUpdate, "8", []byte("sops document"))
	c.Digest, c.SealedFor = keyed, []string{"age1x"}
	cands.add("local", "u1", "8", cand("alice", admission.OpUpdate, admission.DigestOf(keyed)))
	j.Join(c, func(a AttributedChange) { out <- a })
	a := await(t, out)
	require.True(t, a.Author.Resolved)
	require.Equal(t, "alice", a.Author.Username)
	require.Equal(t, "admission", a.Author.Source)
}
