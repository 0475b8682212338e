package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

func credsSecret() runtime.Object {
	return newSecret("creds", map[string]string{"password": testPassword})
}

func TestSyncTarget(t *testing.T) {
	tests := []struct {
		name   string
		target *v1alpha1.GitTarget
		// provider is seeded when set; syncProvider runs first when it is Ready by probeErr.
		provider *v1alpha1.GitProvider
		probeErr error

		wantStatus metav1.ConditionStatus
		wantReason string
		wantMsg    []string
		wantDest   *v1alpha1.Destination
	}{
		{
			name: "source cluster kubeconfig Secret missing",
			target: newTarget("web", "git", "main", "", func(t *v1alpha1.GitTarget) {
				t.Spec.SourceCluster = &v1alpha1.SourceCluster{
					KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "remote-kubeconfig"},
					AuditRoute:          "edge",
				}
			}),
			provider:   newProvider("git", bareRepo),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonSecretNotFound,
			wantMsg:    []string{`Secret "remote-kubeconfig"`, `cluster "edge"`},
		},
		{
			name:       "provider not found",
			target:     newTarget("web", "nope", "main", ""),
			provider:   newProvider("git", bareRepo),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonProviderNotFound,
			wantMsg:    []string{`GitProvider "nope" not found in namespace "team-a"`},
		},
		{
			name:       "provider not ready",
			target:     newTarget("web", "git", "main", ""),
			provider:   newProvider("git", bareRepo),
			probeErr:   errors.New("listing the repository: connection refused"),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonProviderNotReady,
			wantMsg:    []string{`GitProvider "git" is not Ready`},
		},
		{
			name:       "ready in a folder",
			target:     newTarget("web", "git", "main", "clusters/prod"),
			provider:   newProvider("git", bareRepo),
			wantStatus: metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
			wantMsg:    []string{`branch "main"`, `folder "clusters/prod"`},
			wantDest:   &v1alpha1.Destination{Branch: "main", Path: "clusters/prod"},
		},
		{
			name:       "ready at the repository root",
			target:     newTarget("web", "git", "release/v1", ""),
			provider:   newProvider("git", bareRepo),
			wantStatus: metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
			wantMsg:    []string{`branch "release/v1"`, "the repository root"},
			wantDest:   &v1alpha1.Destination{Branch: "release/v1", Path: ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureConfig{
				objects: []runtime.Object{tt.provider, tt.target},
				secrets: []runtime.Object{credsSecret()},
			})
			f.probe.setErr(tt.probeErr)
			if err := f.syncProvider(tt.provider.Name); tt.probeErr == nil {
				require.NoError(t, err)
			}

			require.NoError(t, f.syncTarget("web"))

			got := f.target("web")
			requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, tt.wantStatus, tt.wantReason, tt.wantMsg...)
			require.Equal(t, tt.wantDest, got.Status.ObservedDestination)

			rt, routed := f.route("web")
			require.Equal(t, tt.wantStatus == metav1.ConditionTrue, routed, "a Ready target, and only one, is routed")
			workers := f.router.WorkerCount()
			if !routed {
				require.Zero(t, workers, "no git worker runs for a target that is not Ready")
				return
			}
			require.Equal(t, tt.target.Spec.Path, rt.Path)
			require.Equal(t, nn("git"), rt.Remote.Provider)
			require.Equal(t, tt.target.Spec.Branch, rt.Branch)
			require.Equal(t, 1, workers)
		})
	}
}

// TestSyncTargetProviderNeverSynced: a GitProvider that exists but has not been reconciled yet
// is not Ready for its targets.
func TestSyncTargetProviderNeverSynced(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), newTarget("web", "git", "main", "")},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonProviderNotReady)
	require.Nil(t, got.Status.ObservedDestination)
}

// TestSyncTargetFollowsProvider: while its provider fails a re-check the target is not Ready
// but keeps writing with the provider's last settings that worked; once the provider is
// deleted the target loses its route and its git worker stops.
func TestSyncTargetFollowsProvider(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), newTarget("web", "git", "main", "")},
		secrets: []runtime.Object{credsSecret()},
	})
	workers := f.router.WorkerCount
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	before, routed := f.route("web")
	require.True(t, routed)
	require.Equal(t, 1, workers())

	f.probe.setErr(errors.New("listing the repository: 503"))
	require.Error(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonProviderNotReady,
		`GitProvider "git" is not Ready`, "last settings that worked")
	after, routed := f.route("web")
	require.True(t, routed, "changes keep flowing with the last settings that worked")
	require.Same(t, before.Worker, after.Worker)
	require.Equal(t, 1, workers())

	f.probe.setErr(nil)
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	got = f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)

	require.NoError(t, f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Delete(context.Background(), "git", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, exists, _ := f.c.informers[kindProvider].GetIndexer().GetByKey(nn("git").String())
		return !exists
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	got = f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonProviderNotFound)
	_, routed = f.route("web")
	require.False(t, routed)
	require.Zero(t, workers())

	// A deleted target drops its route; the sync of a missing object succeeds.
	require.NoError(t, f.syncTarget("gone"))
}

// TestSyncTargetSharesBranchWorkers: targets on one branch of one provider share its single
// writer; another branch gets its own; rotated credentials replace the worker for every target
// on the branch.
func TestSyncTargetSharesBranchWorkers(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo),
			newTarget("web", "git", "main", "apps/web"),
			newTarget("db", "git", "main", "apps/db"),
			newTarget("staging", "git", "staging", ""),
		},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncProvider("git"))
	for _, name := range []string{"web", "db", "staging"} {
		require.NoError(t, f.syncTarget(name))
	}
	web, _ := f.route("web")
	db, _ := f.route("db")
	staging, _ := f.route("staging")
	require.Same(t, web.Worker, db.Worker)
	require.NotSame(t, web.Worker, staging.Worker)
	require.Equal(t, "apps/web", web.Path)
	require.Equal(t, "apps/db", db.Path)

	// The token is rotated: the running worker takes the new credentials in place, keeping
	// what it holds; both targets stay on it.
	s, err := f.kube.CoreV1().Secrets(testNS).Get(context.Background(), "creds", metav1.GetOptions{})
	require.NoError(t, err)
	s.Data["password"] = []byte(testPassword + "-rotated")
	_, err = f.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	web2, _ := f.route("web")
	db2, _ := f.route("db")
	require.Same(t, web.Worker, web2.Worker, "a credentials rotation keeps the worker")
	require.Same(t, web2.Worker, db2.Worker)
	require.Equal(t, testPassword+"-rotated", web2.Remote.Credentials.Password)

	// Another commit window needs a new worker: the next target sync on the branch starts it
	// for both targets at once.
	p := f.provider("git")
	p.Spec.CommitWindow = &metav1.Duration{Duration: 30 * time.Millisecond}
	_, err = f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Update(context.Background(), toUnstructured(t, &p), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the controller reads its informer cache
		var cached v1alpha1.GitProvider
		ok, err := f.c.get(kindProvider, nn("git"), &cached)
		return err == nil && ok && cached.GetCommitWindow() == 30*time.Millisecond
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	web3, _ := f.route("web")
	db3, _ := f.route("db")
	require.NotSame(t, web2.Worker, web3.Worker)
	require.Same(t, web3.Worker, db3.Worker, "the other target on the branch moves to the new worker")
	require.Equal(t, 2, f.router.WorkerCount())
}

// TestSyncTargetReportsPushFailure: a target whose worker cannot reach the repository is
// reported PushFailed while it stays routed, so nothing is dropped.
func TestSyncTargetReportsPushFailure(t *testing.T) {
	missing := "file:///nonexistent/kubescribe-test/remote.git"
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", missing), newTarget("web", "git", "main", "")},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	rt, routed := f.route("web")
	require.True(t, routed)
	require.Eventually(t, func() bool { return rt.Worker.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonPushFailed, missing, `branch "main"`)
	require.Equal(t, &v1alpha1.Destination{Branch: "main"}, got.Status.ObservedDestination)
	_, routed = f.route("web")
	require.True(t, routed, "a target whose pushes fail keeps its route: changes queue up")
}

// TestSyncTargetZeroCommitWindow: a GitProvider with commitWindow "0s" (the CRD now rejects
// it with a CEL rule, which an older API server does not enforce, and objects stored before
// the rule keep it) must not be reported Ready while each of its targets fails on it. Either
// the provider reports the invalid spec, mirroring the CEL rule, or 0s works.
func TestSyncTargetZeroCommitWindow(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo, func(p *v1alpha1.GitProvider) { p.Spec.CommitWindow = &metav1.Duration{} }),
			newTarget("web", "git", "main", ""),
		},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	p := readyCondition(t, f.provider("git").Status.Conditions)
	tg := readyCondition(t, f.target("web").Status.Conditions)
	providerRefuses := p.Status == metav1.ConditionFalse && p.Reason == v1alpha1.ReasonInvalidSpec && strings.Contains(p.Message, "commitWindow")
	targetWorks := tg.Status == metav1.ConditionTrue
	require.True(t, providerRefuses || targetWorks,
		"provider: %s %s %q; target: %s %s %q", p.Status, p.Reason, p.Message, tg.Status, tg.Reason, tg.Message)
}

// A fetchInterval the CRD's CEL rule refuses (an older API server stores it anyway) makes the
// provider report its spec invalid, naming the field.
func TestSyncProviderRefusesFetchIntervalOutOfRange(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 25 * time.Hour} {
		f := newFixture(t, fixtureConfig{
			objects: []runtime.Object{newProvider("git", bareRepo, func(p *v1alpha1.GitProvider) {
				p.Spec.FetchInterval = &metav1.Duration{Duration: d}
			})},
			secrets: []runtime.Object{credsSecret()},
		})
		require.NoError(t, f.syncProvider("git"))
		p := readyCondition(t, f.provider("git").Status.Conditions)
		require.Equal(t, metav1.ConditionFalse, p.Status, d.String())
		require.Equal(t, v1alpha1.ReasonInvalidSpec, p.Reason)
		require.Contains(t, p.Message, "spec.fetchInterval "+d.String())
	}
}

// TestSyncTargetForgetsDeletedTargetPushes: a push shows in the target's status; a GitTarget
// that is deleted and created again (for example on another provider) starts without the last
// push of its predecessor.
func TestSyncTargetForgetsDeletedTargetPushes(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo, func(p *v1alpha1.GitProvider) {
			p.Spec.CommitWindow = &metav1.Duration{Duration: 10 * time.Millisecond}
		}), newTarget("web", "git", "main", "")},
		secrets: []runtime.Object{credsSecret()},
	})
	f.makeReady()
	f.router.Deliver(attributed(configMapChange("web", "settings")))
	waitFor(t, 15*time.Second, "the push to be recorded", func() bool {
		return f.router.TargetStatus(nn("web")).LastCommit != ""
	})
	require.NoError(t, f.syncTarget("web"))
	require.NotEmpty(t, f.target("web").Status.LastCommit)

	require.NoError(t, f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Delete(context.Background(), "web", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, exists, _ := f.c.informers[kindTarget].GetIndexer().GetByKey(nn("web").String())
		return !exists
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, f.c.syncTarget(f.ctx, nn("web"))) // web was deleted

	_, err := f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Create(context.Background(),
		toUnstructured(t, newTarget("web", "elsewhere", "main", "")), metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, exists, _ := f.c.informers[kindTarget].GetIndexer().GetByKey(nn("web").String())
		return exists
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	require.Empty(t, got.Status.LastCommit)
	require.Nil(t, got.Status.LastPushTime)
}

// TestSyncTargetRefusesOverlappingFolders: two GitTargets whose folders overlap on one branch
// of one repository would undo each other's sweeps; the older keeps writing, the other is
// refused with a condition naming it. Another branch, or a folder beside it, is fine; once the
// older one is deleted, the other writes.
func TestSyncTargetRefusesOverlappingFolders(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo),
			newTarget("a-apps", "git", "main", "apps"),
			newTarget("b-web", "git", "main", "apps/web/"),
			newTarget("c-db", "git", "main", "db"),
			newTarget("d-apps", "git", "staging", "apps"),
		},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncProvider("git"))
	for _, name := range []string{"a-apps", "b-web", "c-db", "d-apps"} {
		require.NoError(t, f.syncTarget(name))
	}
	for _, name := range []string{"a-apps", "c-db", "d-apps"} {
		got := f.target(name)
		requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	}
	got := f.target("b-web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonPathOverlap,
		`folder "apps/web"`, "GitTarget team-a/a-apps", `folder "apps"`)
	_, routed := f.route("b-web")
	require.False(t, routed)

	require.NoError(t, f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Delete(context.Background(), "a-apps", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, exists, _ := f.c.informers[kindTarget].GetIndexer().GetByKey(nn("a-apps").String())
		return !exists
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, f.c.syncTarget(f.ctx, nn("a-apps")))
	require.NoError(t, f.syncTarget("b-web"))
	got = f.target("b-web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
}

func TestPathsOverlap(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"", "apps", true}, {"/", "apps", true}, {"apps", "apps/", true}, {"apps", "apps/web", true},
		{"apps/web", "apps", true}, {"apps", "apps-2", false}, {"apps/web", "apps/db", false},
	} {
		require.Equal(t, tt.want, pathsOverlap(tt.a, tt.b), "%q %q", tt.a, tt.b)
	}
}
