// Package controller turns kubescribe's CRDs (GitProvider, GitTarget, WatchRule,
// ClusterWatchRule) into desired
// state: it tells the git router where each target's changes go and the watch side which
// streams WatchRules want, and reads back what they report into status conditions. It does not
// carry changes: those flow watch -> attribution -> git without passing through here.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// FieldManager is the field manager of every write the controller makes.
const FieldManager = "kubescribe"

// Periodic re-checks. Secrets are read with a GET when needed; a metadata-only watch of Secrets
// (Options.Metadata) re-enqueues their GitProviders and GitTargets as soon as they change.
const (
	providerRecheck = 5 * time.Minute
	targetRecheck   = time.Minute
	notReadyRecheck = 30 * time.Second
	// progressFallback re-checks a rule still listing and a retarget still pushing its
	// snapshot. The data path reports each step of both as it happens (followProgress); this
	// only bounds how long a lost signal would be noticed late.
	progressFallback = 30 * time.Second
)

// Options configures a Controller.
type Options struct {
	// Client reaches the cluster kubescribe runs in (the config plane: CRDs and Secrets).
	Client dynamic.Interface
	Kube   kubernetes.Interface
	// Sources holds the source clusters. A rule is resolved and watched in the entry of its
	// GitTarget's cluster: Cluster (the cluster kubescribe runs in), or the remote cluster the
	// controller registers under spec.sourceCluster.auditRoute.
	Sources *watch.Registry
	// Cluster is the audit route of the source cluster.
	Cluster string
	// Router writes each target's changes to its branch; the controller routes targets.
	Router *git.Router
	// ProbeRemote checks that a repository answers with the given credentials. Test seam;
	// defaults to git.Probe.
	ProbeRemote func(ctx context.Context, url string, creds git.Credentials) error
	// Logger is the base logger; the controller adds component=controller, watch or git.
	Logger *slog.Logger
	// Verdicts holds what admission recorded of CommitRequests; nil means no records, so no
	// CommitRequest can name its submitter.
	Verdicts VerdictSource
	// CommitRequestTTL is how long a finished CommitRequest is kept before the controller
	// deletes it; 0 keeps it.
	CommitRequestTTL time.Duration
	// Registerer, when set, receives the controller's metrics.
	Registerer prometheus.Registerer

	// Metadata, when set, watches the metadata of Secrets (never their data), so that a
	// GitTarget whose kubeconfig Secret changes or goes is reconciled at once; without it the
	// Secret is read at each reconcile.
	Metadata metadata.Interface
	// AllowRemoteKubeconfigExec accepts kubeconfigs of remote source clusters that run an exec
	// or auth-provider plugin; AllowRemoteKubeconfigInsecure accepts insecure-skip-tls-verify
	// and http:// servers. Both are refused by default.
	AllowRemoteKubeconfigExec, AllowRemoteKubeconfigInsecure bool
	// AuditRouteNamespaces binds each remote audit route to the namespaces whose GitTargets
	// may mirror it (spec.sourceCluster.auditRoute): the platform's decision, not the first
	// claimant's. A route not listed is refused to every GitTarget (AuditRouteNotBound).
	AuditRouteNamespaces map[string][]string
	// SecretRefs, when set, holds what admission recorded of the Secret references of
	// GitProviders and GitTargets (authz.SecretRefStore): the controller uses the Secrets an
	// object names, and encrypts Secrets for a GitTarget, only for a spec someone who may read
	// them vouched for (secretrefs.go). Nil checks nothing (tests, and
	// --insecure-skip-secret-reference-check).
	SecretRefs SecretRefVerdicts
	// NewSourceClients builds the clients of a remote source cluster; NewSourceClients by
	// default. Test seam.
	NewSourceClients func(*rest.Config) (SourceClients, error)
	// SourceProbeInterval is how old a remote cluster's last reachability answer may be before
	// it is asked again; 0 means 10s. Test seam.
	SourceProbeInterval time.Duration
	// AttributionWebhook, when set, makes the controller manage the attribution webhook
	// configuration (attributionwebhook.go).
	AttributionWebhook *AttributionWebhookOptions
	// Cursors, when set, removes resume cursors: those of the destination a GitTarget leaves
	// (retarget) and those of a deleted GitTarget. watch.CursorStore implements it.
	Cursors CursorDropper
	// Ownership, when set, says which branches this replica writes and whether it runs the
	// singletons (several replicas: ownership.go). Nil: every branch, and the singletons.
	Ownership Ownership
	// Handovers, when set, counts the branches this replica comes to write and stops writing.
	Handovers HandoverMetrics
	// InFlight, when set, counts a GitTarget's changes between the watch and the git router
	// (in the attribution join); a retarget is done only once none of its snapshot is left
	// there. attribution.Joiner.InFlight implements it. Drained signals that some targets'
	// count fell to zero and DrainedTargets names them (attribution.Joiner.Drained,
	// DrainedTargets), so that a retarget waiting for it is checked at once.
	InFlight       func(types.NamespacedName) int
	Drained        <-chan struct{}
	DrainedTargets func() []types.NamespacedName
}

// CursorDropper removes resume cursors.
type CursorDropper interface {
	DropDestination(ctx context.Context, cluster string, target types.NamespacedName, destination string) (int, error)
	DropTarget(ctx context.Context, target types.NamespacedName) (int, error)
}

type kind string

const (
	kindProvider kind = "GitProvider"
	kindTarget   kind = "GitTarget"
	kindRule     kind = "WatchRule"
	// kindCommitRequest is driven by commitrequest.go.
	kindCommitRequest kind = "CommitRequest"
	// kindClusterRule objects are cluster-scoped: their keys have no namespace.
	kindClusterRule kind = "ClusterWatchRule"
	// kindNamespace is watched (never reconciled) for ClusterWatchRule namespaceSelectors.
	kindNamespace kind = "Namespace"
)

type key struct {
	kind kind
	types.NamespacedName
}

// Controller is the CRD controller. Create it with New, run it with Run, and stop the data flow
// it started with Drain.
type Controller struct {
	opts  Options
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[key]

	factory   dynamicinformer.DynamicSharedInformerFactory
	informers map[kind]cache.SharedIndexInformer

	mu        sync.RWMutex
	providers map[types.NamespacedName]*git.Remote // last settings that passed a check
	// providerReady holds the providers whose latest check passed.
	providerReady map[types.NamespacedName]bool

	// sources are the remote source clusters GitTargets use (sourcecluster.go); secrets watches
	// Secret metadata for them (nil without Options.Metadata).
	sources      sourceState
	secrets      cache.SharedIndexInformer
	sourceBuilds *prometheus.CounterVec

	// owned holds the branches (branchKey) this replica writes; resumes, by branch, whether its
	// streams replay when subscribed (Resumable).
	owned   map[string]struct{}
	resumes map[string]*resumeDecision
	// supersedeSeen holds, by branch, the last time its worker here was superseded
	// (git.Router.LastSuperseded) that acquire acted on.
	supersedeSeen map[string]time.Time
	// releasedHere holds the GitTargets this replica stopped writing (release) and has not
	// written again since (acquire).
	releasedHere map[types.NamespacedName]struct{}
	// wanted holds, per rule owner, the streams of the local cluster the rule asks for,
	// whichever replica runs them: what the attribution webhook configuration covers.
	wanted map[string][]watch.StreamSpec
	// replayed holds, per GitTarget, the start-overs of its branch and the foreign edits of its
	// folder last acted on (git.TargetStatus.StartOvers, ForeignEdits; replayIfLost).
	replayed map[types.NamespacedName]replayMark

	// refsVerified holds, by GitProvider and GitTarget, the UID and spec digest whose Secret
	// references admission vouched for (secretrefs.go).
	refsVerified map[key]verifiedSpec

	// events records Kubernetes Events about kubescribe objects (Retargeted).
	broadcaster record.EventBroadcaster
	events      record.EventRecorder
}

// New returns a Controller.
func New(opts Options) (*Controller, error) {
	switch {
	case opts.Client == nil || opts.Kube == nil:
		return nil, errors.New("controller: Options.Client and Options.Kube are required")
	case opts.Sources == nil:
		return nil, errors.New("controller: Options.Sources is required")
	case opts.Cluster == "":
		return nil, errors.New("controller: Options.Cluster is required")
	case opts.Router == nil:
		return nil, errors.New("controller: Options.Router is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ProbeRemote == nil {
		opts.ProbeRemote = git.Probe
	}
	if opts.NewSourceClients == nil {
		opts.NewSourceClients = NewSourceClients
	}
	if opts.SourceProbeInterval == 0 {
		opts.SourceProbeInterval = sourceProbeInterval
	}
	if opts.Handovers == nil {
		opts.Handovers = noHandovers{}
	}
	c := &Controller{
		opts:          opts,
		log:           opts.Logger,
		providers:     map[types.NamespacedName]*git.Remote{},
		providerReady: map[types.NamespacedName]bool{},
		sources:       sourceState{entries: map[string]*sourceEntry{}},
		replayed:      map[types.NamespacedName]replayMark{},
		owned:         map[string]struct{}{},
		resumes:       map[string]*resumeDecision{},
		supersedeSeen: map[string]time.Time{},
		releasedHere:  map[types.NamespacedName]struct{}{},
		wanted:        map[string][]watch.StreamSpec{},
		refsVerified:  map[key]verifiedSpec{},
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("controller: building the event scheme: %w", err)
	}
	c.broadcaster = record.NewBroadcaster()
	c.events = c.broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "kubescribe"})
	// Per-object exponential backoff, 1s up to 5m: a failing object (an unreachable repository)
	// is retried patiently without starving the others.
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[key](time.Second, 5*time.Minute),
		workqueue.TypedRateLimitingQueueConfig[key]{Name: "kubescribe"})
	if opts.Registerer != nil {
		err := opts.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubescribe_controller_queue_depth",
			Help: "Objects (GitProviders, GitTargets, WatchRules, ClusterWatchRules, CommitRequests) waiting to be reconciled.",
		}, func() float64 { return float64(c.queue.Len()) }))
		if err != nil {
			return nil, fmt.Errorf("controller: registering metrics: %w", err)
		}
		c.sourceBuilds = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_source_cluster_client_builds_total",
			Help: "Clients built for a remote source cluster from its kubeconfig Secret, by cluster (audit route): once when it is first used, once per change of the kubeconfig's content.",
		}, []string{"cluster"})
		if err := opts.Registerer.Register(c.sourceBuilds); err != nil {
			return nil, fmt.Errorf("controller: registering metrics: %w", err)
		}
	}
	var err error
	if c.secrets, err = c.newSecretWatch(); err != nil {
		return nil, fmt.Errorf("controller: watching Secret metadata: %w", err)
	}
	c.factory = dynamicinformer.NewDynamicSharedInformerFactory(opts.Client, 0)
	c.informers = map[kind]cache.SharedIndexInformer{
		kindProvider: c.factory.ForResource(v1alpha1.GitProvidersResource).Informer(),
		kindTarget:   c.factory.ForResource(v1alpha1.GitTargetsResource).Informer(),
		kindRule:     c.factory.ForResource(v1alpha1.WatchRulesResource).Informer(),

		kindCommitRequest: c.factory.ForResource(v1alpha1.CommitRequestsResource).Informer(),
		kindClusterRule:   c.factory.ForResource(v1alpha1.ClusterWatchRulesResource).Informer(),
		kindNamespace:     c.factory.ForResource(namespacesResource).Informer(),
	}
	for k, inf := range c.informers {
		handler := cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.enqueueObject(k, obj) },
			UpdateFunc: func(_, obj any) { c.enqueueObject(k, obj) },
			DeleteFunc: func(obj any) { c.enqueueObject(k, obj) },
		}
		if k == kindNamespace {
			handler = cache.ResourceEventHandlerFuncs{
				AddFunc:    func(any) { c.enqueueSelectingClusterRules() },
				UpdateFunc: func(_, _ any) { c.enqueueSelectingClusterRules() },
				DeleteFunc: func(any) { c.enqueueSelectingClusterRules() },
			}
		}
		_, err := inf.AddEventHandler(handler)
		if err != nil {
			return nil, fmt.Errorf("controller: adding %s handler: %w", k, err)
		}
	}
	return c, nil
}

// Run starts the informers and reconciles until ctx ends. The watches it asked for keep running
// until the source registry stops, so a shutdown can finish in-flight changes.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer c.queue.ShutDown()
	c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.opts.Kube.CoreV1().Events("")})
	defer c.broadcaster.Shutdown()

	c.factory.Start(ctx.Done())
	if c.secrets != nil && !c.secretWatchAllowed(ctx) {
		c.secrets = nil
	}
	if c.secrets != nil {
		go c.secrets.RunWithContext(ctx)
	}
	for k, inf := range c.informers {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			if ctx.Err() != nil {
				return nil // stopped while starting
			}
			return fmt.Errorf("controller: %s cache did not sync", k)
		}
	}
	c.log.Info("controller caches synced", "workers", workers)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.followRouter(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); c.followSources(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); c.followOwnership(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); c.followStreams(ctx) }()
	if c.opts.Drained != nil && c.opts.DrainedTargets != nil {
		wg.Add(1)
		go func() { defer wg.Done(); c.followDrained(ctx) }()
	}
	if c.opts.AttributionWebhook != nil {
		wg.Add(1)
		go func() { defer wg.Done(); c.attributionWebhook().run(ctx) }()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	c.factory.Shutdown()
	c.sources.mu.Lock()
	for _, e := range c.sources.entries {
		e.stop()
	}
	c.sources.mu.Unlock()
	return nil
}

// Synced reports whether the controller's caches have synced; used by readiness.
func (c *Controller) Synced() bool {
	for _, inf := range c.informers {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// follow calls handle with what changed each time updates signals, until ctx ends: how the
// controller reads back what the data path reports, without the data path calling it.
func follow[K any](ctx context.Context, updates <-chan struct{}, changed func() []K, handle func([]K)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-updates:
			if keys := changed(); len(keys) > 0 {
				handle(keys)
			}
		}
	}
}

// followRouter refreshes the status of the targets whose pushes the router reported (a push
// landed or failed), so it shows without waiting for the periodic re-check.
func (c *Controller) followRouter(ctx context.Context) {
	follow(ctx, c.opts.Router.Updates(), c.opts.Router.Changed, func(targets []types.NamespacedName) {
		for _, name := range targets {
			c.enqueue(kindTarget, name)
			c.enqueueReferencing(kindCommitRequest, name.Namespace, "targetRef", name.Name)
		}
	})
}

// followStreams checks again the rules of the targets whose streams finished handing their
// initial state over (their Ready turns from "listing"), and the targets themselves (a retarget
// waits for it).
func (c *Controller) followStreams(ctx context.Context) {
	follow(ctx, c.opts.Sources.Synced(), c.opts.Sources.SyncedTargets, func(targets []types.NamespacedName) {
		for _, name := range targets {
			c.enqueue(kindTarget, name)
			c.enqueueReferencing(kindRule, name.Namespace, "targetRef", name.Name)
			c.enqueueClusterRulesFor(name)
		}
	})
}

// followDrained checks again the targets whose changes all left the attribution join (a
// retarget waits for its snapshot to).
func (c *Controller) followDrained(ctx context.Context) {
	follow(ctx, c.opts.Drained, c.opts.DrainedTargets, func(targets []types.NamespacedName) {
		for _, name := range targets {
			c.enqueue(kindTarget, name)
		}
	})
}

// followSources re-evaluates every WatchRule and ClusterWatchRule when the discovery catalog of
// the source cluster changed (a CRD became served, an aggregated API came or went), so a rule
// resolves afresh without waiting for its periodic re-check.
func (c *Controller) followSources(ctx context.Context) {
	follow(ctx, c.opts.Sources.Updates(), c.opts.Sources.Changed, func(changed []string) {
		c.log.Debug("discovery catalog changed; re-evaluating every rule", "clusters", changed)
		c.enqueueAll(kindRule)
		c.enqueueAll(kindClusterRule)
	})
}

func (c *Controller) processNext(ctx context.Context) bool {
	k, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(k)
	var err error
	switch k.kind {
	case kindProvider:
		err = c.syncProvider(ctx, k.NamespacedName)
	case kindTarget:
		err = c.syncTarget(ctx, k.NamespacedName)
	case kindRule:
		err = c.syncRule(ctx, k.NamespacedName)
	case kindCommitRequest:
		err = c.syncCommitRequest(ctx, k.NamespacedName)
	case kindClusterRule:
		err = c.syncClusterRule(ctx, k.NamespacedName)
	}
	if apierrors.IsConflict(err) {
		// The cache was behind the object (typically right after our own write): try again.
		c.log.Debug("status write conflicted; retrying", "kind", k.kind, "object", k.NamespacedName.String())
		c.queue.AddRateLimited(k)
		return true
	}
	if err != nil {
		c.log.Warn("reconcile failed; will retry", "kind", k.kind, "object", k.NamespacedName.String(), "err", err)
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

func (c *Controller) enqueueObject(k kind, obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	c.enqueue(k, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()})
}

func (c *Controller) enqueue(k kind, name types.NamespacedName) {
	c.queue.Add(key{kind: k, NamespacedName: name})
}

// get reads an object of kind k from the informer cache into out (a pointer to a typed API
// object, which is a fresh copy). It reports false when the object does not exist.
func (c *Controller) get(k kind, name types.NamespacedName, out runtime.Object) (bool, error) {
	cacheKey := name.String()
	if name.Namespace == "" {
		cacheKey = name.Name // a cluster-scoped object's key has no namespace part
	}
	obj, exists, err := c.informers[k].GetIndexer().GetByKey(cacheKey)
	if err != nil || !exists {
		return false, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return false, fmt.Errorf("unexpected %T in the %s cache", obj, k)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return false, fmt.Errorf("decoding %s %s: %w", k, name, err)
	}
	return true, nil
}

// list returns the objects of kind k in namespace ns, decoded by decode.
func (c *Controller) list(k kind, ns string, visit func(u *unstructured.Unstructured)) {
	objs, err := c.informers[k].GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			visit(u)
		}
	}
}

// enqueueReferencing enqueues every object of kind k in ns whose spec.<field>.name is name;
// field may be a dotted path ("signing.secretRef").
func (c *Controller) enqueueReferencing(k kind, ns, field, name string) {
	path := append(append([]string{"spec"}, strings.Split(field, ".")...), "name")
	c.list(k, ns, func(u *unstructured.Unstructured) {
		ref, _, _ := unstructured.NestedString(u.Object, path...)
		if ref == name {
			c.enqueue(k, types.NamespacedName{Namespace: ns, Name: u.GetName()})
		}
	})
}

// writeStatus stores obj's status with the dynamic client when it differs from before (the
// status as cached); an unchanged status is not written again.
func (c *Controller) writeStatus(ctx context.Context, gvr schema.GroupVersionResource, obj runtime.Object, before, after any) error {
	if equality.Semantic.DeepEqual(before, after) {
		return nil
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: content}
	_, err = c.opts.Client.Resource(gvr).Namespace(u.GetNamespace()).UpdateStatus(ctx, u, metav1UpdateOptions)
	if err != nil {
		return fmt.Errorf("updating status of %s %s/%s: %w", gvr.Resource, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}
