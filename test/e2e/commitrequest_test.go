package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// requestWindow is the GitProvider's commit window in these tests: long enough that only a
// CommitRequest, or another author's change, closes a window while a test runs.
const requestWindow = 10 * time.Minute

// requestMirror is a mirror whose writes the test follows through kubescribe's join.
type requestMirror struct {
	*mirror
	// basePending is kubescribe's git pending-changes gauge once the mirror is set up; at
	// cleanup the worker's open window is flushed and the gauge is back to at most this.
	basePending int
	// resolved is how many resolved joins kubescribe had made before the last write.
	resolved int
}

// newRequestMirror is an empty namespace where alice and bob write ConfigMaps and create
// CommitRequests, alice holds assert-author on GitTarget "tenants" only, and GitTarget
// "tenants" mirrors the ConfigMaps into folder tenants of branch main. At cleanup the GitTargets are
// deleted, so the branch worker commits its open window and stops.
func newRequestMirror(t *testing.T, ns string) *requestMirror {
	t.Helper()
	ctx := context.Background()
	admin := clientFor(t, "admin")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindRole(t, admin, ns, "writers", append([]rbacv1.PolicyRule{{
		APIGroups: []string{"kubescribe.dev"}, Resources: []string{"commitrequests"}, Verbs: []string{"get", "list", "watch", "create"},
	}}, configMapWriters...), "alice", "bob")
	// The grant the issue names: assert-author on GitTarget tenants only.
	bindRole(t, admin, ns, "assert-author-tenants", []rbacv1.PolicyRule{{
		APIGroups: []string{"kubescribe.dev"}, Resources: []string{"gittargets"}, ResourceNames: []string{"tenants"}, Verbs: []string{"assert-author"},
	}}, "alice")

	m := newRepoProvider(t, env, admin, ns, requestWindow)
	// Folders of one branch may not overlap: each target has its own.
	for name, path := range map[string]string{"tenants": "tenants", "other": "other"} {
		create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main", Path: path},
		})
	}
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "tenants"}, Rules: watchConfigMaps},
	})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)
	rm := &requestMirror{mirror: m, basePending: pendingChanges(t)}
	t.Cleanup(func() {
		for _, name := range []string{"tenants", "other"} {
			_ = dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}
		require.True(t, poll(60*time.Second, func() bool { return pendingChanges(t) <= rm.basePending }),
			"the worker of %s did not flush its window", ns)
	})
	return rm
}

// pendingChanges is kubescribe's kubescribe_git_pending_changes gauge.
func pendingChanges(t *testing.T) int {
	t.Helper()
	return int(metricValue(t, "kubescribe_git_pending_changes"))
}

// writeConfigMap creates a ConfigMap as user.
func writeConfigMap(t *testing.T, m *requestMirror, user, name string) {
	t.Helper()
	m.resolved = resolvedJoins(t)
	_, err := clientFor(t, user).CoreV1().ConfigMaps(m.ns).Create(context.Background(),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"by": user}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// awaitOpenWindow waits until the change just written was attributed to its author and handed
// to the branch worker (a resolved join more, and no join pending: the join hands the change
// over before it stops counting it as pending), and main holds exactly commits commits. The
// change then sits in its author's open window: a CommitRequest created now reaches the worker
// after it. (The e2e tests run one at a time; nothing else is being joined.)
func awaitOpenWindow(t *testing.T, m *requestMirror, commits int) {
	t.Helper()
	var got []string
	ok := poll(60*time.Second, func() bool {
		got = m.commits(t)
		return len(got) == commits && resolvedJoins(t) > m.resolved &&
			metricValue(t, "kubescribe_attribution_pending_changes") == 0
	})
	require.True(t, ok, "want %d commits and the write joined; commits %q, resolved joins %d (before the write %d), pending joins %v",
		commits, got, resolvedJoins(t), m.resolved, metricValue(t, "kubescribe_attribution_pending_changes"))
}

// resolvedJoins is kubescribe's count of changes attributed to their authors.
func resolvedJoins(t *testing.T) int {
	t.Helper()
	return int(metricValue(t, `kubescribe_attribution_joins_total{result="resolved"}`))
}

type requestSpec struct {
	target, message string
	author          *v1alpha1.Identity
}

func commitRequestObject(ns, name string, spec requestSpec) *v1alpha1.CommitRequest {
	return &v1alpha1.CommitRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "CommitRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.CommitRequestSpec{TargetRef: v1alpha1.LocalObjectReference{Name: spec.target}, Message: spec.message, Author: spec.author},
	}
}

// submit creates a CommitRequest as user; dryRun asks the apiserver (and the webhook) without
// storing it.
func submit(t *testing.T, user, ns, name string, spec requestSpec, dryRun bool) error {
	t.Helper()
	u, err := runtimeToUnstructured(commitRequestObject(ns, name, spec))
	require.NoError(t, err)
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = dynamicFor(t, user).Resource(v1alpha1.CommitRequestsResource).Namespace(ns).Create(context.Background(), u, opts)
	return err
}

// waitRequest waits until the request is final and returns it.
func waitRequest(t *testing.T, ns, name string) v1alpha1.CommitRequest {
	t.Helper()
	var cr v1alpha1.CommitRequest
	ok := poll(90*time.Second, func() bool {
		u, err := dynamicFor(t, "admin").Resource(v1alpha1.CommitRequestsResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		cr = v1alpha1.CommitRequest{}
		require.NoError(t, fromUnstructured(u.Object, &cr))
		return cr.Status.CompletionTime != nil
	})
	require.True(t, ok, "CommitRequest %s/%s never finished; status %+v", ns, name, cr.Status)
	return cr
}

func requireConditions(t *testing.T, cr v1alpha1.CommitRequest, ready metav1.ConditionStatus, readyReason string, attributed metav1.ConditionStatus, attributedReason string) {
	t.Helper()
	r := meta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, r)
	require.Equal(t, readyReason, r.Reason, r.Message)
	require.Equal(t, ready, r.Status, r.Message)
	a := meta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionAuthorAttributed)
	require.NotNil(t, a)
	require.Equal(t, attributedReason, a.Reason, a.Message)
	require.Equal(t, attributed, a.Status, a.Message)
}

// waitWebhook waits until the apiserver calls the webhook (bob's dry-run assertion is
// denied) or, with active false, no longer calls it (the dry run is admitted).
func waitWebhook(t *testing.T, ns string, active bool) {
	t.Helper()
	probe := requestSpec{target: "tenants", message: "probe", author: &v1alpha1.Identity{Name: "Probe", Email: "probe@example.com"}}
	i := 0
	ok := poll(60*time.Second, func() bool {
		i++
		err := submit(t, "bob", ns, "probe-"+strconv.Itoa(i), probe, true)
		return active == apierrors.IsForbidden(err)
	})
	require.True(t, ok, "the webhook never became active=%v", active)
}

// alice, granted assert-author on tenants, names the author of her commit; the same request on
// another GitTarget, and bob's on tenants, are denied, each naming the rule that would grant it.
func TestCommitRequestAssertedAuthor(t *testing.T) {
	m := newRequestMirror(t, "e2e-cr-assert")
	waitWebhook(t, m.ns, true)
	jane := &v1alpha1.Identity{Name: "Jane Tenant", Email: "jane@tenants.example.com"}

	err := submit(t, "alice", m.ns, "wrong-target", requestSpec{target: "other", message: "m", author: jane}, false)
	require.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
	require.ErrorContains(t, err, `resourceNames: ["other"], verbs: ["assert-author"]`)
	require.ErrorContains(t, err, `user "alice"`)

	err = submit(t, "bob", m.ns, "bob-asserts", requestSpec{target: "tenants", message: "m", author: jane}, false)
	require.True(t, apierrors.IsForbidden(err), "want Forbidden, got %v", err)
	require.ErrorContains(t, err, `resourceNames: ["tenants"], verbs: ["assert-author"]`)

	writeConfigMap(t, m, "alice", "onboarding")
	awaitOpenWindow(t, m, 0)
	require.NoError(t, submit(t, "alice", m.ns, "onboard", requestSpec{target: "tenants", message: "Onboard tenant jane\n\nTicket 42.", author: jane}, false))
	cr := waitRequest(t, m.ns, "onboard")
	requireConditions(t, cr, metav1.ConditionTrue, v1alpha1.ReasonCommitted, metav1.ConditionTrue, v1alpha1.ReasonAuthorAsserted)
	require.Equal(t, "alice", cr.Status.Submitter)
	require.Equal(t, "main", cr.Status.Branch)
	require.Equal(t, m.git(t, "rev-parse", "main"), cr.Status.SHA)
	require.Equal(t, "Jane Tenant|jane@tenants.example.com|kubescribe|Onboard tenant jane", m.git(t, "log", "-1", "--format=%an|%ae|%cn|%s", "main"))
	body := m.git(t, "log", "-1", "--format=%B", "main")
	require.Contains(t, body, "Ticket 42.")
	require.Contains(t, body, "Kubescribe-User: alice\n")
	require.Contains(t, body, "Kubescribe-Submitter: alice\n")
	require.Contains(t, body, "Kubescribe-Commit-Request: "+m.ns+"/onboard")
	require.Equal(t, "tenants/"+m.ns+"/core/configmaps/onboarding.yaml", strings.TrimSpace(m.git(t, "show", "--format=", "--name-only", "main")))
}

// With the webhook registration removed, bob's assertion is admitted but never honoured: no
// admission record, so AuthorAssertionUnverified, and no commit carries the asserted identity.
func TestCommitRequestWebhookBypassed(t *testing.T) {
	ctx := context.Background()
	m := newRequestMirror(t, "e2e-cr-bypass")
	require.NoError(t, env.RemoveWebhook(ctx))
	t.Cleanup(func() {
		require.NoError(t, env.RegisterWebhook(ctx))
		waitWebhook(t, m.ns, true)
	})
	waitWebhook(t, m.ns, false)

	writeConfigMap(t, m, "bob", "sneaky")
	awaitOpenWindow(t, m, 0)
	mallory := &v1alpha1.Identity{Name: "Mallory Forged", Email: "mallory@example.com"}
	require.NoError(t, submit(t, "bob", m.ns, "forge", requestSpec{target: "tenants", message: "Forged", author: mallory}, false))
	cr := waitRequest(t, m.ns, "forge")
	requireConditions(t, cr, metav1.ConditionFalse, v1alpha1.ReasonSubmitterUnknown, metav1.ConditionFalse, v1alpha1.ReasonAuthorAssertionUnverified)
	require.Empty(t, cr.Status.SHA)

	// bob's change is committed under bob when the next author's change closes his window.
	writeConfigMap(t, m, "alice", "after")
	awaitOpenWindow(t, m, 1)
	require.Equal(t, "bob|create configmaps "+m.ns+"/sneaky", m.git(t, "log", "-1", "--format=%an|%s", "main"))
	require.NotContains(t, m.git(t, "log", "--format=%an %ae%n%B", "main"), "Mallory")
}

// With Redis stopped while the webhook is up, alice's (authorized) assertion cannot be
// recorded: it is refused (admitted without a verdict, anyone holding an admission credential
// could supply one). Her request without an author is admitted, and closes no window.
func TestCommitRequestRedisDown(t *testing.T) {
	m := newRequestMirror(t, "e2e-cr-redis")
	waitWebhook(t, m.ns, true)
	writeConfigMap(t, m, "alice", "change")
	awaitOpenWindow(t, m, 0)

	require.NoError(t, env.StopRedis())
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = env.StartRedis()
		}
	})
	eve := &v1alpha1.Identity{Name: "Eve Asserted", Email: "eve@example.com"}
	err := submit(t, "alice", m.ns, "asserted", requestSpec{target: "tenants", message: "Unrecorded", author: eve}, false)
	require.ErrorContains(t, err, "could not record the verdict")
	require.NoError(t, submit(t, "alice", m.ns, "unrecorded", requestSpec{target: "tenants", message: "Unrecorded"}, false))
	require.NoError(t, env.StartRedis())
	restarted = true

	cr := waitRequest(t, m.ns, "unrecorded")
	requireConditions(t, cr, metav1.ConditionFalse, v1alpha1.ReasonSubmitterUnknown, metav1.ConditionFalse, v1alpha1.ReasonCommitterFallback)
	writeConfigMap(t, m, "bob", "next")
	awaitOpenWindow(t, m, 1)
	require.Equal(t, "alice|create configmaps "+m.ns+"/change", m.git(t, "log", "-1", "--format=%an|%s", "main"))
	require.NotContains(t, m.git(t, "log", "--format=%an %ae%n%B", "main"), "Eve")
}

// alice's request without author closes only her window, with her message: while bob's window
// is open she has none (NoOpenWindow) and bob's stays open; her own window closes with her
// message.
func TestCommitRequestClosesOnlyTheSubmittersWindow(t *testing.T) {
	m := newRequestMirror(t, "e2e-cr-own")
	waitWebhook(t, m.ns, true)

	writeConfigMap(t, m, "bob", "bobs")
	awaitOpenWindow(t, m, 0)
	require.NoError(t, submit(t, "alice", m.ns, "too-early", requestSpec{target: "tenants", message: "Not mine to close"}, false))
	cr := waitRequest(t, m.ns, "too-early")
	requireConditions(t, cr, metav1.ConditionFalse, v1alpha1.ReasonNoOpenWindow, metav1.ConditionTrue, v1alpha1.ReasonAttributedFromAdmission)
	awaitOpenWindow(t, m, 0) // bob's window is untouched

	writeConfigMap(t, m, "alice", "alices")
	awaitOpenWindow(t, m, 1) // alice's change closed bob's window (the generated message)
	require.Equal(t, "bob|create configmaps "+m.ns+"/bobs", m.git(t, "log", "-1", "--format=%an|%s", "main"))
	require.NoError(t, submit(t, "alice", m.ns, "why", requestSpec{target: "tenants", message: "Alice explains why"}, false))
	cr = waitRequest(t, m.ns, "why")
	requireConditions(t, cr, metav1.ConditionTrue, v1alpha1.ReasonCommitted, metav1.ConditionTrue, v1alpha1.ReasonAttributedFromAdmission)
	require.Equal(t, m.git(t, "rev-parse", "main"), cr.Status.SHA)
	require.Equal(t, "alice|kubescribe|Alice explains why", m.git(t, "log", "-1", "--format=%an|%cn|%s", "main"))
	require.NotContains(t, m.git(t, "log", "--format=%B", "main"), "Not mine to close")
}
