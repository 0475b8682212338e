package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/watch"
)

type fakeVerdicts struct {
	mu sync.Mutex
	m  map[types.UID]authz.Verdict
}

func (f *fakeVerdicts) Lookup(_ context.Context, uid types.UID) (authz.Verdict, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.m[uid]
	return v, ok, nil
}

func newCommitRequest(name string, author *v1alpha1.Identity, mutate ...func(*v1alpha1.CommitRequest)) *v1alpha1.CommitRequest {
	cr := &v1alpha1.CommitRequest{
		TypeMeta:   typeMeta("CommitRequest"),
		ObjectMeta: objectMeta(name),
		Spec:       v1alpha1.CommitRequestSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "web"}, Message: "Why: " + name, Author: author},
	}
	cr.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Minute))
	for _, m := range mutate {
		m(cr)
	}
	return cr
}

func verdictFor(cr *v1alpha1.CommitRequest, user string, authorized bool) authz.Verdict {
	v := authz.Verdict{UID: cr.UID, Namespace: cr.Namespace, Name: cr.Name, Target: cr.Spec.TargetRef.Name,
		Submitter: authz.Submitter{Username: user}, Authorized: authorized}
	if a := cr.Spec.Author; a != nil {
		v.Author = &authz.Author{Name: a.Name, Email: a.Email}
	}
	return v
}

// changeBy is a resolved change of a ConfigMap by user, for target web.
func changeBy(user, name string) attribution.AttributedChange {
	return attribution.AttributedChange{
		Change: watch.Change{Cluster: testCluster, Target: nn("web"), GVR: configMapsGVR, Namespace: testNS, Name: name,
			UID: "uid-cm-" + name, ResourceVersion: "7", Op: watch.OpCreate,
			Manifest: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\n")},
		Author: attribution.Author{Identity: audit.Identity{Username: user}, Resolved: true, AuditID: "a-" + name},
	}
}

func (f *fixture) syncCommitRequest(name string) error {
	f.waitCached(kindCommitRequest, v1alpha1.CommitRequestsResource, name)
	return f.c.syncCommitRequest(f.ctx, nn(name))
}

func (f *fixture) commitRequest(name string) v1alpha1.CommitRequest {
	f.t.Helper()
	var cr v1alpha1.CommitRequest
	f.getObject(v1alpha1.CommitRequestsResource, name, &cr)
	return cr
}

// syncUntilFinal syncs the request until its Ready condition is final.
func (f *fixture) syncUntilFinal(name string) v1alpha1.CommitRequest {
	f.t.Helper()
	var cr v1alpha1.CommitRequest
	require.Eventually(f.t, func() bool {
		require.NoError(f.t, f.syncCommitRequest(name))
		cr = f.commitRequest(name)
		return cr.Status.CompletionTime != nil
	}, 20*time.Second, 20*time.Millisecond, "commit request %s never finished", name)
	return cr
}

func requireCondition(t *testing.T, conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	c := meta.FindStatusCondition(conds, typ)
	require.NotNil(t, c, "no %s condition in %v", typ, conds)
	require.Equal(t, status, c.Status, "%s (%s: %s)", typ, c.Reason, c.Message)
	require.Equal(t, reason, c.Reason, "%s message %q", typ, c.Message)
}

var jane = &v1alpha1.Identity{Name: "Jane Doe", Email: "jane@example.com"}

// TestSyncCommitRequest walks every status transition of a CommitRequest against a real branch
// worker writing to a bare repository.
func TestSyncCommitRequest(t *testing.T) {
	tests := []struct {
		name      string
		author    *v1alpha1.Identity
		delivered []string // users whose changes are delivered before the request, in order
		verdict   string   // submitter recorded at admission; "" = no record
		authorize bool

		wantReady      string
		wantAttributed string
		wantAttrTrue   bool
		wantGitAuthor  string // "" = no commit expected
	}{
		{name: "submitter's window", delivered: []string{"alice"}, verdict: "alice",
			wantReady: v1alpha1.ReasonCommitted, wantAttributed: v1alpha1.ReasonAttributedFromAdmission, wantAttrTrue: true, wantGitAuthor: "alice"},
		{name: "asserted author", author: jane, delivered: []string{"alice"}, verdict: "alice", authorize: true,
			wantReady: v1alpha1.ReasonCommitted, wantAttributed: v1alpha1.ReasonAuthorAsserted, wantAttrTrue: true, wantGitAuthor: "Jane Doe"},
		{name: "assertion not authorized", author: jane, delivered: []string{"alice"}, verdict: "alice",
			wantReady: v1alpha1.ReasonCommitted, wantAttributed: v1alpha1.ReasonAuthorAssertionUnverified, wantGitAuthor: "alice"},
		{name: "assertion without record", author: jane, delivered: []string{"alice"},
			wantReady: v1alpha1.ReasonSubmitterUnknown, wantAttributed: v1alpha1.ReasonAuthorAssertionUnverified},
		{name: "no record", delivered: []string{"alice"},
			wantReady: v1alpha1.ReasonSubmitterUnknown, wantAttributed: v1alpha1.ReasonCommitterFallback},
		{name: "no open window", verdict: "alice",
			wantReady: v1alpha1.ReasonNoOpenWindow, wantAttributed: v1alpha1.ReasonAttributedFromAdmission, wantAttrTrue: true},
		{name: "another author's window", delivered: []string{"bob"}, verdict: "alice",
			wantReady: v1alpha1.ReasonNoOpenWindow, wantAttributed: v1alpha1.ReasonAttributedFromAdmission, wantAttrTrue: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cr := newCommitRequest("why", tt.author)
			provider := newProvider("git", bareRepo, func(p *v1alpha1.GitProvider) { p.Spec.CommitWindow = &metav1.Duration{Duration: time.Hour} })
			f := newFixture(t, fixtureConfig{
				objects: []runtime.Object{provider, newTarget("web", "git", "main", "apps"), cr},
				secrets: []runtime.Object{credsSecret()},
			})
			verdicts := &fakeVerdicts{m: map[types.UID]authz.Verdict{}}
			if tt.verdict != "" {
				verdicts.m[cr.UID] = verdictFor(cr, tt.verdict, tt.authorize)
			}
			f.c.opts.Verdicts = verdicts
			require.NoError(t, f.syncProvider("git"))
			require.NoError(t, f.syncTarget("web"))
			for i, u := range tt.delivered {
				f.router.Deliver(changeBy(u, u+"-"+string(rune('a'+i))))
			}

			got := f.syncUntilFinal("why")
			requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, conditionStatus(tt.wantReady == v1alpha1.ReasonCommitted), tt.wantReady)
			requireCondition(t, got.Status.Conditions, v1alpha1.ConditionAuthorAttributed, conditionStatus(tt.wantAttrTrue), tt.wantAttributed)
			require.NotNil(t, got.Status.CompletionTime)
			if tt.wantGitAuthor == "" {
				require.Empty(t, got.Status.SHA)
				if len(tt.delivered) > 0 && tt.delivered[0] == "bob" {
					require.Equal(t, 1, f.router.TargetStatus(nn("web")).Pending, "bob's window must stay open")
				}
				return
			}
			require.Equal(t, tt.verdict, got.Status.Submitter)
			require.Equal(t, "main", got.Status.Branch)
			require.Equal(t, runGit(t, "", "--git-dir="+f.repoDir, "rev-parse", "refs/heads/main"), got.Status.SHA)
			require.Equal(t, tt.wantGitAuthor+"|kubescribe|Why: why", runGit(t, "", "--git-dir="+f.repoDir, "log", "-1", "--format=%an|%cn|%s", "main"))
			require.Contains(t, runGit(t, "", "--git-dir="+f.repoDir, "log", "-1", "--format=%B", "main"), "Kubescribe-Submitter: "+tt.verdict+"\n")
			_, known := f.router.CloseResult(types.NamespacedName{Namespace: cr.Namespace, Name: cr.Spec.TargetRef.Name}, string(cr.UID))
			require.False(t, known, "the router forgets a finished request")
		})
	}
}

func TestSyncCommitRequestWaitsForTheCloseDelay(t *testing.T) {
	cr := newCommitRequest("later", nil, func(cr *v1alpha1.CommitRequest) {
		cr.CreationTimestamp = metav1.NewTime(time.Now())
		d := int32(600)
		cr.Spec.CloseDelaySeconds = &d
	})
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{cr}})
	require.NoError(t, f.syncCommitRequest("later"))
	got := f.commitRequest("later")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionUnknown, v1alpha1.ReasonProgressing, "closeDelaySeconds (600)")
	require.Nil(t, got.Status.CompletionTime)
}

func TestSyncCommitRequestUnroutedTarget(t *testing.T) {
	cr := newCommitRequest("why", nil)
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{cr}})
	f.c.opts.Verdicts = &fakeVerdicts{m: map[types.UID]authz.Verdict{cr.UID: verdictFor(cr, "alice", false)}}
	for range 2 { // a retry is not mistaken for a request lost by a restart
		require.NoError(t, f.syncCommitRequest("why"))
		got := f.commitRequest("why")
		requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonTargetNotReady)
		require.Nil(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionAuthorAttributed))
		require.Nil(t, got.Status.CompletionTime, "not final: retried until the target is routed")
	}
}

func TestSyncCommitRequestVerdictOfAnotherObjectIsIgnored(t *testing.T) {
	cr := newCommitRequest("why", jane)
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{cr}})
	v := verdictFor(cr, "alice", true)
	v.Name = "other"
	f.c.opts.Verdicts = &fakeVerdicts{m: map[types.UID]authz.Verdict{cr.UID: v}}
	got := f.syncUntilFinal("why")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSubmitterUnknown)
	requireCondition(t, got.Status.Conditions, v1alpha1.ConditionAuthorAttributed, metav1.ConditionFalse, v1alpha1.ReasonAuthorAssertionUnverified)
}

func TestSyncCommitRequestLostAfterRestart(t *testing.T) {
	// The status says the request was handed to a worker, but this router never saw it.
	cr := newCommitRequest("why", nil, func(cr *v1alpha1.CommitRequest) {
		cr.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAuthorAttributed, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonAttributedFromAdmission, LastTransitionTime: metav1.Now()}}
	})
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{cr}})
	got := f.syncUntilFinal("why")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonFailed)
}

func TestSyncCommitRequestExpires(t *testing.T) {
	cr := newCommitRequest("old", nil, func(cr *v1alpha1.CommitRequest) {
		done := metav1.NewTime(time.Now().Add(-2 * time.Hour))
		cr.Status.CompletionTime = &done
	})
	kept := newCommitRequest("recent", nil, func(cr *v1alpha1.CommitRequest) {
		done := metav1.NewTime(time.Now())
		cr.Status.CompletionTime = &done
	})
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{cr, kept}})
	f.c.opts.CommitRequestTTL = time.Hour
	require.NoError(t, f.syncCommitRequest("old"))
	require.NoError(t, f.syncCommitRequest("recent"))
	_, err := f.dyn.Resource(v1alpha1.CommitRequestsResource).Namespace(testNS).Get(context.Background(), "old", metav1.GetOptions{})
	require.Error(t, err, "an expired request is deleted")
	f.commitRequest("recent")
}
