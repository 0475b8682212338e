package controller

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func TestNewValidatesOptions(t *testing.T) {
	valid := func() Options {
		dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
			v1alpha1.GitProvidersResource: "GitProviderList",
			v1alpha1.GitTargetsResource:   "GitTargetList",
			v1alpha1.WatchRulesResource:   "WatchRuleList",
		})
		sources, err := watch.NewRegistry(watch.RegistryOptions{Render: renderName, Emit: func(watch.Change) {}})
		require.NoError(t, err)
		return Options{
			Client:  dyn,
			Kube:    kubefake.NewClientset(),
			Sources: sources,
			Cluster: testCluster,
			Router:  git.NewRouter(git.RouterOptions{}),
			Logger:  slog.New(slog.DiscardHandler),
		}
	}
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "valid", mutate: func(*Options) {}},
		{name: "valid without logger and probe", mutate: func(o *Options) { o.Logger, o.ProbeRemote = nil, nil }},
		{name: "no client", mutate: func(o *Options) { o.Client = nil }, wantErr: "Options.Client and Options.Kube are required"},
		{name: "no kube", mutate: func(o *Options) { o.Kube = nil }, wantErr: "Options.Client and Options.Kube are required"},
		{name: "no sources", mutate: func(o *Options) { o.Sources = nil }, wantErr: "Options.Sources is required"},
		{name: "no cluster", mutate: func(o *Options) { o.Cluster = "" }, wantErr: "Options.Cluster is required"},
		{name: "no router", mutate: func(o *Options) { o.Router = nil }, wantErr: "Options.Router is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid()
			tt.mutate(&o)
			c, err := New(o)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Nil(t, c)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, c)
			require.NotNil(t, c.opts.ProbeRemote)
			require.False(t, c.Synced(), "nothing is synced before Run")
		})
	}
}

func configMapChange(target, name string) watch.Change {
	return watch.Change{
		Cluster:         testCluster,
		Target:          nn(target),
		GVR:             configMapsGVR,
		Namespace:       testNS,
		Name:            name,
		UID:             "uid-cm-" + name,
		ResourceVersion: "7",
		Op:              watch.OpUpdate,
		Manifest:        []byte("name: " + name + "\n"),
		Observed:        time.Now(),
	}
}

// TestDeliverWithoutRoute: a change for a target that is not Ready (or unknown) is dropped.
func TestDeliverWithoutRoute(t *testing.T) {
	f := newFixture(t, fixtureConfig{})
	require.NotPanics(t, func() { f.router.Deliver(attributed(configMapChange("web", "settings"))) })
	require.Zero(t, f.router.WorkerCount())
	require.False(t, f.router.Routed(nn("web")))
}

// TestDeliverToRoutedTarget: a change for a Ready target reaches the worker of its branch,
// which commits it under the target's folder and pushes; a change for another target does not.
func TestDeliverToRoutedTarget(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo, func(p *v1alpha1.GitProvider) {
				// Long enough for Pending to be read before the commit.
				p.Spec.CommitWindow = &metav1.Duration{Duration: 500 * time.Millisecond}
			}),
			newTarget("web", "git", "main", "apps/web"),
			newTarget("unready", "missing", "main", "apps/unready"),
		},
		secrets: []runtime.Object{credsSecret()},
	})
	f.makeReady()
	require.NoError(t, f.syncTarget("unready"))
	rt, ok := f.route("web")
	require.True(t, ok)

	f.router.Deliver(attributed(configMapChange("web", "settings")))
	f.router.Deliver(attributed(configMapChange("unready", "dropped")))
	f.router.Deliver(attributed(configMapChange("unknown", "dropped-too")))
	require.Equal(t, 1, rt.Worker.Status().Pending, "only the routed change is queued")

	const file = "apps/web/team-a/core/configmaps/settings.yaml"
	waitFor(t, 15*time.Second, "the pushed commit", func() bool {
		return slices.Contains(branchFiles(f.repoDir, "main"), file)
	})
	require.Equal(t, []string{file}, branchFiles(f.repoDir, "main"))
	require.Equal(t, "alice", runGit(t, "", "--git-dir="+f.repoDir, "log", "-1", "--format=%an", "main"))
	waitFor(t, 5*time.Second, "the push to be recorded", func() bool {
		return f.router.TargetStatus(nn("web")).LastCommit != ""
	})
	require.Zero(t, rt.Worker.Status().Pending)

	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	require.Equal(t, runGit(t, "", "--git-dir="+f.repoDir, "rev-parse", "refs/heads/main"), got.Status.LastCommit)
	require.NotNil(t, got.Status.LastPushTime)
}

// readyStatus is the Ready condition's status, "" while there is none.
func readyStatus(conds []metav1.Condition) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); c != nil {
		return c.Status
	}
	return ""
}

// TestRunEndToEnd runs the controller with a reconcile worker, as the application does, and
// checks that the objects' statuses converge and a watched object lands in the repository.
func TestRunEndToEnd(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo),
			newTarget("web", "git", "main", "clusters/dev"),
			newRule("cms", "web", rule([]string{""}, []string{"configmaps"})),
			newConfigMap("settings"),
		},
		secrets: []runtime.Object{credsSecret()},
		workers: 1,
	})

	waitFor(t, 30*time.Second, "the WatchRule to be Ready", func() bool {
		return readyStatus(f.watchRule("cms").Status.Conditions) == metav1.ConditionTrue
	})
	p := f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	r := f.watchRule("cms")
	requireReady(t, r.Status.Conditions, r.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady, "v1/configmaps")
	require.Equal(t, []string{"v1/configmaps"}, r.Status.Resources)

	const file = "clusters/dev/team-a/core/configmaps/settings.yaml"
	waitFor(t, 30*time.Second, "the snapshot commit", func() bool {
		return slices.Contains(branchFiles(f.repoDir, "main"), file)
	})
	head := runGit(t, "", "--git-dir="+f.repoDir, "rev-parse", "refs/heads/main")
	waitFor(t, 30*time.Second, "the target to report its last commit", func() bool {
		return f.target("web").Status.LastCommit == head
	})
	tg := f.target("web")
	requireReady(t, tg.Status.Conditions, tg.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "clusters/dev"}, tg.Status.ObservedDestination)
	require.NotNil(t, tg.Status.LastPushTime)
}

// TestProcessNext: a failed sync is retried with backoff, a conflicting status write too; a
// sync that succeeds, or fails for good (a Secret to fix), is forgotten by the rate limiter.
func TestProcessNext(t *testing.T) {
	tests := []struct {
		name         string
		secret       map[string]string
		probeErr     error
		conflict     bool
		wantRequeues int
	}{
		{name: "success", secret: map[string]string{"password": testPassword}},
		{name: "terminal failure", secret: map[string]string{"username": "robot"}},
		{name: "retryable failure", secret: map[string]string{"password": testPassword}, probeErr: errors.New("connection refused"), wantRequeues: 1},
		{name: "status write conflict", secret: map[string]string{"password": testPassword}, conflict: true, wantRequeues: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureConfig{
				objects: []runtime.Object{newProvider("git", remoteURL)},
				secrets: []runtime.Object{newSecret("creds", tt.secret)},
			})
			f.probe.setErr(tt.probeErr)
			if tt.conflict {
				f.dyn.PrependReactor("update", "gitproviders", func(a clienttesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() != "status" {
						return false, nil, nil
					}
					return true, nil, apierrors.NewConflict(v1alpha1.Resource("gitproviders"), "git", errors.New("the object has been modified"))
				})
			}
			k := key{kind: kindProvider, NamespacedName: nn("git")}
			f.c.queue.Add(k) // the informer's add event queued it already; Add deduplicates
			require.Equal(t, 1, f.c.queue.Len())
			require.True(t, f.c.processNext(context.Background()))
			require.Equal(t, tt.wantRequeues, f.c.queue.NumRequeues(k))
		})
	}
}

// TestEnqueueObject: events enqueue the object's key, tombstones included; anything else is
// ignored.
func TestEnqueueObject(t *testing.T) {
	f := newFixture(t, fixtureConfig{})
	web := toUnstructured(t, newTarget("web", "git", "main", ""))
	f.c.enqueueObject(kindTarget, cache.DeletedFinalStateUnknown{Key: "team-a/web", Obj: web})
	f.c.enqueueObject(kindTarget, web)
	f.c.enqueueObject(kindTarget, "not an object")
	f.c.enqueueObject(kindTarget, cache.DeletedFinalStateUnknown{Key: "team-a/x", Obj: "not an object"})
	require.Equal(t, 1, f.c.queue.Len())
	k, shutdown := f.c.queue.Get()
	require.False(t, shutdown)
	require.Equal(t, key{kind: kindTarget, NamespacedName: nn("web")}, k)
	f.c.queue.Done(k)
}
