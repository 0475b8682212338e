package controller

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// fakeOwnership is a view of the replicas a test sets by hand.
type fakeOwnership struct {
	mu      sync.Mutex
	owned   map[string]bool
	leading bool
	c       chan struct{}
	// handedOver are the keys a live replica hands over (PreviousOwnerLost false).
	handedOver map[string]bool
}

func newFakeOwnership(leading bool) *fakeOwnership {
	return &fakeOwnership{owned: map[string]bool{}, leading: leading, c: make(chan struct{}, 1), handedOver: map[string]bool{}}
}

func (o *fakeOwnership) Owns(k string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.owned[k]
}

func (o *fakeOwnership) Leading() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leading
}

func (o *fakeOwnership) Updates() <-chan struct{} { return o.c }

func (o *fakeOwnership) TakeoverGap(string) (time.Duration, bool) { return 3 * time.Second, true }
func (o *fakeOwnership) PreviousOwnerLost(k string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.handedOver[k]
}

func (o *fakeOwnership) own(k string, owns bool) {
	o.mu.Lock()
	o.owned[k] = owns
	o.mu.Unlock()
	select {
	case o.c <- struct{}{}:
	default:
	}
}

// A replica that does not own a GitTarget's branch neither routes it, nor watches for its
// rules, nor writes their status; once it owns the branch it does all three, and when the
// branch moves away it lets go of the target and its streams. The GitProvider's status is the
// leader's.
func TestOnlyTheOwnerOfABranchWritesItsTargets(t *testing.T) {
	own := newFakeOwnership(false)
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo),
			newTarget("web", "git", "main", "clusters/web"),
			newRule("cms", "web", rule([]string{""}, []string{"configmaps"})),
		},
		secrets:   []runtime.Object{credsSecret()},
		ownership: own,
	})
	key := testNS + "/git:main"

	require.NoError(t, f.syncProvider("git"))
	require.Empty(t, f.provider("git").Status.Conditions, "only the leader reports a GitProvider")
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	require.False(t, f.router.Routed(nn("web")))
	require.Empty(t, f.sources.Cluster(testCluster).Streams())
	require.Empty(t, f.target("web").Status.Conditions)
	require.Empty(t, f.watchRule("cms").Status.Conditions)

	own.own(key, true)
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	require.True(t, f.router.Routed(nn("web")))
	require.NotEmpty(t, f.sources.Cluster(testCluster).Streams())
	require.Equal(t, metav1.ConditionTrue, readyOf(f.target("web").Status.Conditions))
	require.NotEmpty(t, f.watchRule("cms").Status.Conditions)
	require.Contains(t, f.logs.String(), "this replica writes a branch now")

	own.own(key, false)
	before := f.target("web").Status
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	require.False(t, f.router.Routed(nn("web")))
	require.Empty(t, f.sources.Cluster(testCluster).Streams())
	require.Equal(t, before, f.target("web").Status, "the new owner writes it")
	require.Contains(t, f.logs.String(), "another replica writes a branch now")
}

func readyOf(conds []metav1.Condition) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == v1alpha1.ConditionReady {
			return c.Status
		}
	}
	return ""
}

// The leader writes the attribution webhook configuration for the rules of every replica: a
// replica that owns none of a rule's GitTarget still counts the resources it asks for.
func TestEveryReplicaKnowsWhatEveryRuleWatches(t *testing.T) {
	own := newFakeOwnership(true)
	url := "https://kubescribe.example:9443"
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo),
			newTarget("web", "git", "main", "clusters/web"),
			newRule("cms", "web", rule([]string{""}, []string{"configmaps"}, v1alpha1.OperationCreate)),
		},
		secrets:            []runtime.Object{credsSecret()},
		ownership:          own,
		attributionWebhook: &AttributionWebhookOptions{ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url}},
	})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	require.Empty(t, f.sources.Cluster(testCluster).Streams(), "not owned: not watched here")
	wanted := f.c.wantedStreams()
	require.Len(t, wanted, 1)
	require.Equal(t, "configmaps", wanted[0].GVR.Resource)
	require.Equal(t, testNS, wanted[0].Namespace)

	require.NoError(t, f.dyn.Resource(v1alpha1.WatchRulesResource).Namespace(testNS).Delete(f.ctx, "cms", metav1.DeleteOptions{}))
	require.NoError(t, f.syncRule("cms"))
	require.Empty(t, f.c.wantedStreams())
}

// A branch's streams replay when this replica comes to write it after its writer was lost, for
// resumeWindow; not when a live replica hands it over, nor for a branch written here all along,
// nor after the window (a stream subscribed then carries this replica's own changes).
func TestResumableOnlyRightAfterALoss(t *testing.T) {
	o := newFakeOwnership(false)
	o.handedOver["ns/p:handed"] = true
	c := &Controller{opts: Options{Ownership: o}, owned: map[string]struct{}{}, resumes: map[string]*resumeDecision{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.True(t, c.resumableLocked("ns/p:lost"))
	require.True(t, c.resumableLocked("ns/p:lost"), "asked again within the window")
	require.False(t, c.resumableLocked("ns/p:handed"))
	c.owned["ns/p:mine"] = struct{}{}
	require.False(t, c.resumableLocked("ns/p:mine"), "written here before anything was decided")
	c.resumes["ns/p:lost"].until = time.Now().Add(-time.Second)
	require.False(t, c.resumableLocked("ns/p:lost"), "after the window")

	c.opts.Ownership = nil
	require.True(t, c.resumableLocked("ns/p:alone"), "without coordination the writer before was this process's predecessor")

	// Once per stream: subscribed again (its cluster's clients rebuilt), it does not replay.
	cm := watch.StreamID{Cluster: "local", Target: types.NamespacedName{Namespace: "ns", Name: "t"}, Namespace: "ns"}
	secrets := cm
	secrets.GVR.Resource = "secrets"
	require.True(t, c.resumableStreamLocked("ns/p:again", cm))
	require.True(t, c.resumableStreamLocked("ns/p:again", secrets), "another stream of the branch")
	require.False(t, c.resumableStreamLocked("ns/p:again", cm), "the same stream subscribed again")
}

// A branch this replica writes again after its worker there was superseded replays, although a
// live replica handed it back and although it was written here before: the superseded worker
// dropped what it held, and the writer in between drops the changes still waiting for authors.
func TestResumableAfterARetake(t *testing.T) {
	o := newFakeOwnership(false)
	o.handedOver["ns/p:b"] = true
	c := &Controller{opts: Options{Ownership: o}, owned: map[string]struct{}{}, resumes: map[string]*resumeDecision{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.False(t, c.resumableLocked("ns/p:b"), "handed over by a live replica")
	c.owned["ns/p:b"] = struct{}{}
	c.retakeLocked("ns/p:b")
	require.True(t, c.resumableLocked("ns/p:b"))
	cm := watch.StreamID{Cluster: "local", Target: types.NamespacedName{Namespace: "ns", Name: "t"}, Namespace: "ns"}
	require.True(t, c.resumableStreamLocked("ns/p:b", cm))
	require.False(t, c.resumableStreamLocked("ns/p:b", cm), "once per stream")
}
