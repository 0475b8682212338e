package controller

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	authorizationv1 "k8s.io/api/authorization/v1"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/remoteerr"
)

// Bounds of the calls a GitTarget with spec.sourceCluster makes while it is reconciled.
const (
	secretReadTimeout = 10 * time.Second
	// sourceProbeTimeout bounds the reachability check of a remote apiserver.
	sourceProbeTimeout = 5 * time.Second
	// sourceProbeInterval is how old a remote's last reachability answer may be before a
	// reconcile of one of its GitTargets asks again.
	sourceProbeInterval = 10 * time.Second
)

var secretsResource = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// SourceClients are the clients of one remote source cluster, built from its kubeconfig.
type SourceClients struct {
	Dynamic   dynamic.Interface
	Discovery discovery.DiscoveryInterface
	// Probe checks that the apiserver answers discovery with the kubeconfig's identity.
	Probe func(context.Context) error
}

// NewSourceClients builds the clients of a remote source cluster from its rest config: a
// dynamic client, a caching discovery client for the watch registry, and a probe that reads
// discovery uncached.
func NewSourceClients(cfg *rest.Config) (SourceClients, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return SourceClients{}, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return SourceClients{}, err
	}
	probe := func(ctx context.Context) error {
		// /api, then /apis: both need an authenticated identity (system:discovery), so a
		// rejected token answers 401 and a identity refused discovery 403.
		_, err := dc.RESTClient().Get().AbsPath("/api").Do(ctx).Raw()
		if err == nil {
			_, err = dc.RESTClient().Get().AbsPath("/apis").Do(ctx).Raw()
		}
		return err
	}
	return SourceClients{Dynamic: dyn, Discovery: memory.NewMemCacheClient(dc), Probe: probe}, nil
}

// sourceEntry is one remote source cluster the controller registered with the watch registry,
// under its audit route, and the GitTargets that use it.
type sourceEntry struct {
	route string
	// hash is the SHA-256 of the kubeconfig the clients were built from. Neither the kubeconfig
	// nor the Secret is kept.
	hash   [sha256.Size]byte
	reach  *reachability
	client dynamic.Interface
	// users are the GitTargets mirroring the cluster, with the Secret each read it from.
	users map[types.NamespacedName]secretUse
	// builds counts the clients built for this route (1 + rotations).
	builds int
	// namespaces watches the remote's Namespaces once a ClusterWatchRule with a
	// namespaceSelector asks for them (remoteNamespaces), with client; stopNamespaces ends it.
	namespaces     cache.SharedIndexInformer
	stopNamespaces context.CancelFunc
	// namespacesFailed is when the Namespace watch last failed (zero: never); while that is
	// recent its cache is not trusted (remoteNamespaces lists instead).
	namespacesFailed atomic.Int64
}

// namespaceWatchDistrust is how long after a failure of a remote Namespace watch its cache is
// not read: longer than client-go's reflector waits between two attempts (at most 30s), so a
// watch that keeps failing is never trusted.
const namespaceWatchDistrust = time.Minute

// stop ends what the entry runs: its Namespace watch.
func (e *sourceEntry) stop() {
	if e.stopNamespaces != nil {
		e.stopNamespaces()
	}
	e.namespaces, e.stopNamespaces = nil, nil
}

// secretUse is where a GitTarget's kubeconfig came from: Secret, key and the resourceVersion it
// was read at.
type secretUse struct {
	secret types.NamespacedName
	key    string
	rv     string
}

// sourceState holds the controller's remote source clusters, by audit route.
type sourceState struct {
	mu      sync.Mutex
	entries map[string]*sourceEntry
}

// refusal says why a GitTarget's source cluster cannot be used.
type refusal struct{ reason, msg string }

// remoteTarget reports whether the GitTarget name mirrors a remote cluster, and its route.
func (c *Controller) remoteTarget(name types.NamespacedName) (string, bool) {
	var t v1alpha1.GitTarget
	exists, err := c.get(kindTarget, name, &t)
	if err != nil || !exists || t.Spec.SourceCluster == nil {
		return "", false
	}
	return t.Spec.SourceCluster.AuditRoute, true
}

// remoteNamespaces lists the namespaces of a remote cluster whose labels sel matches, sorted;
// never nil. The first call for a cluster starts a watch of its Namespaces, whose changes
// re-evaluate the ClusterWatchRules that select namespaces by label, as the local Namespace
// informer does. Until that watch has listed them, the namespaces are listed with the selector.
func (c *Controller) remoteNamespaces(route string, sel labels.Selector) ([]string, error) {
	c.sources.mu.Lock()
	e := c.sources.entries[route]
	var client dynamic.Interface
	if e != nil {
		client = e.client
		if e.namespaces == nil && client != nil {
			c.watchRemoteNamespaces(e)
		}
		// Read under the lock: a rotation replaces the informer, and the old one's cache may
		// be another server's.
		if inf := e.namespaces; inf != nil && inf.HasSynced() && !e.namespacesDistrusted() {
			out := namespacesIn(inf.GetStore(), sel)
			c.sources.mu.Unlock()
			return out, nil
		}
	}
	c.sources.mu.Unlock()
	if client == nil {
		return nil, fmt.Errorf("source cluster %q is not registered", route)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sourceProbeTimeout)
	defer cancel()
	list, err := client.Resource(namespacesResource).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		c.log.Warn("listing the namespaces of a remote source cluster failed", "cluster", route, "err", err)
		return nil, fmt.Errorf("listing the namespaces of cluster %q for namespaceSelector: %s", route, remoteError(err))
	}
	out := []string{}
	for _, ns := range list.Items {
		if sel.Matches(labels.Set(ns.GetLabels())) {
			out = append(out, ns.GetName())
		}
	}
	slices.Sort(out)
	return out, nil
}

// namespacesDistrusted reports whether the Namespace watch failed recently: its cache may be
// stale (the remote revoked watch or list, or cannot be reached).
func (e *sourceEntry) namespacesDistrusted() bool {
	failed := e.namespacesFailed.Load()
	return failed != 0 && time.Since(time.Unix(0, failed)) < namespaceWatchDistrust
}

// watchRemoteNamespaces starts the watch of e's Namespaces: a Namespace that comes, goes or is
// relabelled re-evaluates every ClusterWatchRule with a namespaceSelector; other updates (a
// status or an annotation, or every namespace again at a relist) do not. It runs until the
// entry stops (the cluster is removed, its clients are rebuilt, or the controller stops). While
// the watch fails, the namespaces are listed at each evaluation instead of read from its cache,
// so a failure shows on the rules (WatchFailed) rather than a stale list; the first failure of a
// streak is logged as a warning, client-go's own log line of it is not written.
// c.sources.mu must be held.
func (c *Controller) watchRemoteNamespaces(e *sourceEntry) {
	inf := dynamicinformer.NewFilteredDynamicInformer(e.client, namespacesResource, "", 0, cache.Indexers{}, nil).Informer()
	route := e.route
	changed := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			c.log.Debug("a namespace of a remote source cluster changed; re-evaluating the ClusterWatchRules that select namespaces", "cluster", route, "namespace", u.GetName())
		}
		c.enqueueSelectingClusterRules()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				c.enqueueSelectingClusterRules()
				return
			}
			changed(obj)
		},
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*unstructured.Unstructured)
			n, ok2 := obj.(*unstructured.Unstructured)
			if ok1 && ok2 && maps.Equal(o.GetLabels(), n.GetLabels()) {
				return
			}
			changed(obj)
		},
		DeleteFunc: changed,
	}); err != nil {
		c.log.Warn("cannot watch the namespaces of a remote source cluster; they are listed at each evaluation", "cluster", e.route, "err", err)
		return
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return // the watch closed or expired: the reflector resumes or lists again
		}
		if !e.namespacesDistrusted() {
			c.log.Warn("the watch of a remote source cluster's namespaces failed; they are listed at each evaluation until it works again", "cluster", route, "err", err)
		}
		e.namespacesFailed.Store(time.Now().UnixNano())
		c.enqueueSelectingClusterRules()
	}); err != nil {
		c.log.Warn("cannot handle the failures of the remote namespace watch", "cluster", route, "err", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.namespaces, e.stopNamespaces = inf, cancel
	go inf.RunWithContext(ctx)
	c.log.Info("watching the namespaces of a remote source cluster for namespaceSelector", "cluster", e.route)
}

// useSourceCluster makes sure the remote cluster a GitTarget names is registered with clients
// built from its kubeconfig, and that the target is one of its users; a target without
// spec.sourceCluster stops using any remote one. It returns the refusal when the target cannot
// mirror it.
func (c *Controller) useSourceCluster(name types.NamespacedName, t *v1alpha1.GitTarget) *refusal {
	if t.Spec.SourceCluster == nil {
		c.releaseSource(name, "")
		return nil
	}
	sc := t.Spec.SourceCluster
	route := sc.AuditRoute
	c.releaseSource(name, route)
	if route == c.opts.Cluster {
		c.releaseSource(name, "")
		return &refusal{v1alpha1.ReasonSourceClusterConflict, fmt.Sprintf(
			"spec.sourceCluster.auditRoute %q is the route of the cluster kubescribe runs in (--cluster-name): give the remote cluster a route of its own, or remove spec.sourceCluster to mirror this cluster", route)}
	}
	if !c.routeBound(route, t.Namespace) {
		c.releaseSource(name, "")
		return &refusal{v1alpha1.ReasonAuditRouteNotBound, fmt.Sprintf(
			"audit route %q is not bound to namespace %q: the platform binds each remote cluster's route to the namespaces that may mirror it (kubescribe's --audit-route-namespaces %s=%s), so that no namespace can take another's cluster; nothing of it is mirrored for this GitTarget",
			route, t.Namespace, route, t.Namespace)}
	}
	secret := types.NamespacedName{Namespace: t.Namespace, Name: sc.KubeConfigSecretRef.Name}
	owner, ownerSecret := c.routeOwner(route, name, t)

	// Unchanged Secret (by resourceVersion, from the metadata watch): nothing to read.
	c.sources.mu.Lock()
	if e := c.sources.entries[route]; e != nil {
		if use, ok := e.users[name]; ok && use.secret == secret && slices.Contains(sc.KubeConfigKeys(), use.key) && use.rv != "" && use.rv == c.secretVersion(secret) {
			c.sources.mu.Unlock()
			return nil
		}
	}
	c.sources.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), secretReadTimeout)
	defer cancel()
	s, err := c.opts.Kube.CoreV1().Secrets(secret.Namespace).Get(ctx, secret.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.releaseSource(name, "")
		return &refusal{v1alpha1.ReasonSecretNotFound, fmt.Sprintf(
			"Secret %q (spec.sourceCluster.kubeConfigSecretRef) not found in namespace %q: nothing of cluster %q is mirrored", secret.Name, secret.Namespace, route)}
	case err != nil:
		c.sources.mu.Lock()
		_, attached := c.sources.entries[route].usedBy(name)
		c.sources.mu.Unlock()
		if attached {
			// A failed read is not a deleted Secret: keep mirroring with the clients built.
			c.log.Warn("reading a source cluster kubeconfig Secret failed; keeping its clients", "gittarget", name.String(), "secret", secret.Name, "err", err)
			return nil
		}
		return &refusal{v1alpha1.ReasonSecretNotFound, fmt.Sprintf("reading Secret %q: %v", secret.Name, err)}
	}
	var key string
	var kubeconfig []byte
	for _, k := range sc.KubeConfigKeys() {
		if v, ok := s.Data[k]; ok {
			key, kubeconfig = k, v
			break
		}
	}
	if key == "" {
		c.releaseSource(name, "")
		return &refusal{v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q has no key %s holding a kubeconfig", secret.Name, strings.Join(quoteAll(sc.KubeConfigKeys()), " or "))}
	}
	use := secretUse{secret: secret, key: key, rv: s.ResourceVersion}
	hash := sha256.Sum256(kubeconfig)

	c.sources.mu.Lock()
	defer c.sources.mu.Unlock()
	e := c.sources.entries[route]
	if e != nil && e.hash == hash {
		e.users[name] = use
		return nil
	}
	cfg, ref := restConfigFromKubeconfig(kubeconfig, c.opts.AllowRemoteKubeconfigExec, c.opts.AllowRemoteKubeconfigInsecure)
	if ref != nil {
		ref.msg = fmt.Sprintf("Secret %q key %q: %s", secret.Name, key, ref.msg)
		c.releaseLocked(name, "")
		return ref
	}
	// A kubeconfig other than the one in use (or none registered yet). Only the route's owner,
	// or a GitTarget reading the owner's Secret, builds the route's clients: which cluster a
	// route names never depends on which GitTarget was reconciled first.
	if owner != name && secret != ownerSecret {
		c.releaseLocked(name, "")
		return &refusal{v1alpha1.ReasonSourceClusterConflict, fmt.Sprintf(
			"audit route %q belongs to GitTarget %s, the oldest GitTarget naming it in a namespace bound to it, which reads Secret %q; Secret %q holds a different kubeconfig: one audit route names one cluster, so give this cluster its own spec.sourceCluster.auditRoute (and point its apiserver's audit webhook at /audit/<route>), or use the same kubeconfig",
			route, owner, ownerSecret.String(), secret.String())}
	}
	if e != nil && owner != name {
		// Not the owner, but its Secret: the rotation of the Secret every user reads, unless
		// another user reads another Secret or key.
		for other, u := range e.users {
			if other != name && (u.secret != secret || u.key != key) {
				c.releaseLocked(name, "")
				return &refusal{v1alpha1.ReasonSourceClusterConflict, fmt.Sprintf(
					"audit route %q is already mirrored by GitTarget %s with the kubeconfig of Secret %q, and Secret %q holds a different one: one audit route names one cluster, so give this cluster its own spec.sourceCluster.auditRoute (and point its apiserver's audit webhook at /audit/<route>), or use the same kubeconfig",
					route, other, u.secret.String(), secret.String())}
			}
		}
	}
	clients, err := c.opts.NewSourceClients(cfg)
	if err != nil {
		c.releaseLocked(name, "")
		return &refusal{v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q key %q: building clients: %v", secret.Name, key, err)}
	}
	if e == nil {
		if _, err := c.opts.Sources.ReplaceCluster(route, clients.Dynamic, clients.Discovery); err != nil {
			return &refusal{v1alpha1.ReasonWatchFailed, err.Error()}
		}
		e = &sourceEntry{route: route, users: map[types.NamespacedName]secretUse{}}
		c.sources.entries[route] = e
		c.log.Info("registered a remote source cluster", "cluster", route, "gittarget", name.String(), "secret", secret.String())
		// A GitTarget refused while the route had no clients (its Secret differs from the
		// owner's) may share them now, if its content is the same.
		defer c.enqueueTargetsOfRoute(route)
	} else {
		if _, err := c.opts.Sources.ReplaceCluster(route, clients.Dynamic, clients.Discovery); err != nil {
			return &refusal{v1alpha1.ReasonWatchFailed, err.Error()}
		}
		c.log.Info("the kubeconfig of a remote source cluster changed; rebuilt its clients", "cluster", route, "secret", secret.String())
		for other, u := range e.users {
			if other == name {
				continue
			}
			if u.secret != secret || u.key != key {
				// The owner's kubeconfig replaced one this user shared by content: it stops
				// using the route until its own content matches again.
				delete(e.users, other)
				c.opts.Router.Unroute(other, false)
			}
			c.enqueue(kindTarget, other)
		}
	}
	e.stop() // a Namespace watch of the old clients; the next evaluation starts one with the new
	e.hash, e.reach, e.client = hash, &reachability{probe: clients.Probe}, clients.Dynamic
	e.builds++
	e.users[name] = use
	c.countBuild(route)
	return nil
}

// routeBound reports whether the platform bound the remote audit route to namespace ns
// (Options.AuditRouteNamespaces).
func (c *Controller) routeBound(route, ns string) bool {
	return slices.Contains(c.opts.AuditRouteNamespaces[route], ns)
}

// routeOwner returns the GitTarget that owns route, and the Secret it reads its kubeconfig
// from: the oldest (by creation, then namespace/name) GitTarget naming the route in a namespace
// bound to it, as the informer cache holds them. It is decided by the specs alone, so every
// replica and every restart agrees on it, whatever order the GitTargets are reconciled in.
// self (named name) is counted even when the cache does not hold it yet.
func (c *Controller) routeOwner(route string, name types.NamespacedName, self *v1alpha1.GitTarget) (types.NamespacedName, types.NamespacedName) {
	owner := self
	for _, obj := range c.informers[kindTarget].GetIndexer().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || (u.GetNamespace() == name.Namespace && u.GetName() == name.Name) {
			continue
		}
		if r, _, _ := unstructured.NestedString(u.Object, "spec", "sourceCluster", "auditRoute"); r != route || !c.routeBound(route, u.GetNamespace()) {
			continue
		}
		var other v1alpha1.GitTarget
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &other) != nil || other.Spec.SourceCluster == nil {
			continue
		}
		if olderTarget(&other, owner) {
			owner = &other
		}
	}
	return types.NamespacedName{Namespace: owner.Namespace, Name: owner.Name},
		types.NamespacedName{Namespace: owner.Namespace, Name: owner.Spec.SourceCluster.KubeConfigSecretRef.Name}
}

func (e *sourceEntry) usedBy(name types.NamespacedName) (secretUse, bool) {
	if e == nil {
		return secretUse{}, false
	}
	u, ok := e.users[name]
	return u, ok
}

// releaseSource makes a GitTarget stop using every remote cluster but keep (if set). A cluster
// no target uses any more is removed from the registry: its informers stop.
func (c *Controller) releaseSource(name types.NamespacedName, keep string) {
	c.sources.mu.Lock()
	defer c.sources.mu.Unlock()
	c.releaseLocked(name, keep)
}

func (c *Controller) releaseLocked(name types.NamespacedName, keep string) {
	for route, e := range c.sources.entries {
		if route == keep {
			continue
		}
		if _, ok := e.users[name]; !ok {
			continue
		}
		delete(e.users, name)
		if len(e.users) > 0 {
			continue
		}
		delete(c.sources.entries, route)
		e.stop()
		c.opts.Sources.RemoveCluster(route)
		c.log.Info("no GitTarget mirrors the remote source cluster any more; stopped its watches", "cluster", route)
		// A target refused for claiming the route with another kubeconfig may take it now.
		c.enqueueTargetsOfRoute(route)
	}
}

// enqueueTargetsOfRoute enqueues every GitTarget whose spec.sourceCluster names route.
func (c *Controller) enqueueTargetsOfRoute(route string) {
	for _, obj := range c.informers[kindTarget].GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if r, _, _ := unstructured.NestedString(u.Object, "spec", "sourceCluster", "auditRoute"); r == route {
			c.enqueue(kindTarget, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()})
		}
	}
}

// reachability is the last answer of one remote cluster's probe. Reconciles read it; when it
// is older than the probe interval, a new probe starts in the background, so that a remote that
// does not answer (a blackholed address waits out sourceProbeTimeout) holds up no controller
// worker, and the GitTargets of one route share one probe.
type reachability struct {
	probe func(context.Context) error

	mu      sync.Mutex
	at      time.Time // when the last probe ended; zero before the first
	err     error
	running bool
}

// answer returns the last probe's error, and whether a probe has answered yet. It starts a
// probe when the last answer is older than interval and none is running; done is called once
// that probe has answered.
func (r *reachability) answer(interval time.Duration, done func()) (err error, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running && time.Since(r.at) >= interval {
		r.running = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), sourceProbeTimeout)
			err := r.probe(ctx)
			cancel()
			r.mu.Lock()
			r.at, r.err, r.running = time.Now(), err, false
			r.mu.Unlock()
			done()
		}()
	}
	return r.err, !r.at.IsZero()
}

// reachSourceCluster sets a GitTarget's SourceClusterReachable condition from the last answer
// of its remote cluster's probe (ready from routing), and removes the condition otherwise. A
// cluster that does not answer, or refuses the identity, makes the target not Ready; it stays
// routed, so its watches recover by themselves when the cluster answers again. Until the first
// probe answers, the condition is Unknown; each answer re-enqueues the route's GitTargets.
func (c *Controller) reachSourceCluster(t *v1alpha1.GitTarget, ready bool, reason, msg string) (bool, string, string) {
	if t.Spec.SourceCluster == nil || !ready {
		meta.RemoveStatusCondition(&t.Status.Conditions, v1alpha1.ConditionSourceClusterReachable)
		return ready, reason, msg
	}
	route := t.Spec.SourceCluster.AuditRoute
	c.sources.mu.Lock()
	var reach *reachability
	if e := c.sources.entries[route]; e != nil {
		reach = e.reach
	}
	c.sources.mu.Unlock()
	if reach == nil {
		meta.RemoveStatusCondition(&t.Status.Conditions, v1alpha1.ConditionSourceClusterReachable)
		return ready, reason, msg
	}
	err, known := reach.answer(c.opts.SourceProbeInterval, func() { c.enqueueTargetsOfRoute(route) })
	cond := metav1.Condition{Type: v1alpha1.ConditionSourceClusterReachable, ObservedGeneration: t.Generation,
		Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReachable,
		Message: fmt.Sprintf("cluster %q answers with the identity of Secret %q", route, t.Spec.SourceCluster.KubeConfigSecretRef.Name)}
	switch {
	case !known:
		cond.Status, cond.Reason = metav1.ConditionUnknown, v1alpha1.ReasonProgressing
		cond.Message = fmt.Sprintf("asking cluster %q for its API discovery", route)
	case err != nil:
		cond.Status = metav1.ConditionFalse
		// The remote's own words (a response body, a Status message) are never quoted: only
		// what kind of failure it was (remoteError).
		switch {
		case apierrors.IsUnauthorized(err):
			cond.Reason = v1alpha1.ReasonUnauthorized
			cond.Message = fmt.Sprintf("cluster %q rejected the credentials of Secret %q (401)", route, t.Spec.SourceCluster.KubeConfigSecretRef.Name)
		case apierrors.IsForbidden(err):
			cond.Reason = v1alpha1.ReasonForbidden
			cond.Message = fmt.Sprintf("cluster %q refused API discovery to the identity of Secret %q (403): grant it the kubescribe-source ClusterRole", route, t.Spec.SourceCluster.KubeConfigSecretRef.Name)
		default:
			cond.Reason = v1alpha1.ReasonUnreachable
			cond.Message = fmt.Sprintf("cluster %q does not answer: %s", route, remoteError(err))
		}
		ready, reason, msg = false, v1alpha1.ReasonSourceClusterUnreachable, cond.Message+"; its watches keep retrying"
		if prev := meta.FindStatusCondition(t.Status.Conditions, v1alpha1.ConditionSourceClusterReachable); prev == nil || prev.Message != cond.Message {
			// The condition names only the kind of failure; the server's words go here.
			c.log.Warn("a remote source cluster's API discovery failed", "cluster", route, "gittarget", t.Namespace+"/"+t.Name, "reason", cond.Reason, "err", err)
		}
	}
	meta.SetStatusCondition(&t.Status.Conditions, cond)
	return ready, reason, msg
}

// restConfigFromKubeconfig parses a kubeconfig held in memory and returns the rest config of
// its current context (or its only context). It refuses what would run code, skip TLS
// verification or read a file.
func restConfigFromKubeconfig(kubeconfig []byte, allowExec, allowInsecure bool) (*rest.Config, *refusal) {
	invalid := func(format string, args ...any) (*rest.Config, *refusal) {
		return nil, &refusal{v1alpha1.ReasonSecretInvalid, fmt.Sprintf(format, args...)}
	}
	if len(bytes.TrimSpace(kubeconfig)) == 0 {
		return invalid("the kubeconfig is empty")
	}
	kc, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return invalid("not a kubeconfig: %v", err)
	}
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		for n := range kc.Contexts {
			ctxName = n
		}
	}
	kctx, ok := kc.Contexts[ctxName]
	if !ok || kctx == nil {
		return invalid("the kubeconfig has no current-context (and not exactly one context)")
	}
	cluster, ok := kc.Clusters[kctx.Cluster]
	if !ok || cluster == nil || cluster.Server == "" {
		return invalid("context %q names no cluster with a server", ctxName)
	}
	auth := kc.AuthInfos[kctx.AuthInfo]
	if auth == nil {
		auth = clientcmdapi.NewAuthInfo()
	}
	var files []string
	if cluster.CertificateAuthority != "" {
		files = append(files, "certificate-authority")
	}
	if auth.ClientCertificate != "" {
		files = append(files, "client-certificate")
	}
	if auth.ClientKey != "" {
		files = append(files, "client-key")
	}
	if auth.TokenFile != "" {
		files = append(files, "tokenFile")
	}
	if len(files) > 0 {
		return nil, &refusal{v1alpha1.ReasonKubeConfigFileReference, fmt.Sprintf(
			"the kubeconfig refers to files (%s), which kubescribe does not have and never writes: put their content inline (certificate-authority-data, client-certificate-data, client-key-data, token)", strings.Join(files, ", "))}
	}
	if cluster.ProxyURL != "" {
		// Not quoted: a proxy URL may carry a password.
		return nil, &refusal{v1alpha1.ReasonKubeConfigProxy,
			"the kubeconfig sets proxy-url, which would send kubescribe's connections through an address the Secret's writer chose: remove it; a proxy kubescribe must use is set on its Deployment (HTTPS_PROXY, NO_PROXY)"}
	}
	if (auth.Exec != nil || auth.AuthProvider != nil) && !allowExec {
		what := "an exec plugin"
		if auth.Exec == nil {
			what = fmt.Sprintf("the auth-provider plugin %q", auth.AuthProvider.Name)
		}
		return nil, &refusal{v1alpha1.ReasonKubeConfigExecPlugin, fmt.Sprintf(
			"the kubeconfig's user runs %s to get credentials, which would run code inside kubescribe on behalf of whoever can write the Secret: use a token or a client certificate, or start kubescribe with --allow-remote-kubeconfig-exec", what)}
	}
	u, err := url.Parse(cluster.Server)
	if err != nil || u.Host == "" {
		return invalid("the kubeconfig's server %q is not a URL", cluster.Server)
	}
	if !allowInsecure {
		if cluster.InsecureSkipTLSVerify {
			return nil, &refusal{v1alpha1.ReasonKubeConfigInsecure, "the kubeconfig sets insecure-skip-tls-verify: anyone on the path could read the credentials and feed kubescribe objects; set certificate-authority-data instead, or start kubescribe with --allow-remote-kubeconfig-insecure"}
		}
		if u.Scheme != "https" {
			return nil, &refusal{v1alpha1.ReasonKubeConfigInsecure, fmt.Sprintf("the kubeconfig's server uses %s://, not https://: the credentials would cross the network in clear; use https, or start kubescribe with --allow-remote-kubeconfig-insecure", u.Scheme)}
		}
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*kc, ctxName, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
	if err != nil {
		return invalid("the kubeconfig cannot be used: %v", err)
	}
	cfg.UserAgent = "kubescribe"
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// remoteError describes an error of a request to a remote source cluster for a condition: its
// HTTP status or the class of its connection or TLS failure, never text the server chose (a
// response body or a Status message, which client-go copies into its errors), as Git servers'
// errors are described (remoteerr). The full error goes to the log only.
func remoteError(err error) string { return remoteerr.Describe(err) }

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}

// newSecretWatch watches the metadata of Secrets (never their data) so that a GitTarget is
// reconciled as soon as the kubeconfig Secret it names changes or goes, and a GitProvider as
// soon as its credentials do. It keeps only names and
// resourceVersions: annotations such as kubectl's last-applied-configuration can hold a copy of
// the data.
func (c *Controller) newSecretWatch() (cache.SharedIndexInformer, error) {
	if c.opts.Metadata == nil {
		return nil, nil
	}
	inf := metadatainformer.NewFilteredMetadataInformer(c.opts.Metadata, secretsResource, metav1.NamespaceAll, 0,
		cache.Indexers{}, nil).Informer()
	if err := inf.SetTransform(func(obj any) (any, error) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return obj, nil
		}
		return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}}, nil
	}); err != nil {
		return nil, err
	}
	changed := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			c.enqueueTargetsOfSecret(types.NamespacedName{Namespace: m.Namespace, Name: m.Name})
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if !initial {
				changed(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			o, _ := old.(*metav1.PartialObjectMetadata)
			n, _ := obj.(*metav1.PartialObjectMetadata)
			if o == nil || n == nil || o.ResourceVersion != n.ResourceVersion {
				changed(obj)
			}
		},
		DeleteFunc: changed,
	})
	if err != nil {
		return nil, err
	}
	return inf, nil
}

// secretWatchAllowed says whether kubescribe may list and watch Secrets cluster-wide, as its
// metadata watch of Secrets needs. RBAC cannot grant a Secret's metadata without its data, so
// the default install does not grant them: without this check the refused watch would log an
// error at every retry, forever. Refused, the watch is not started and the Secrets are read at
// each reconcile (a restart notices a later grant). When the review itself fails, the watch
// starts as before.
func (c *Controller) secretWatchAllowed(ctx context.Context) bool {
	for _, verb := range []string{"list", "watch"} {
		review, err := c.opts.Kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: "secrets"}},
		}, metav1.CreateOptions{})
		if err != nil {
			c.log.Warn("cannot tell whether Secrets may be watched; watching their metadata", "err", err)
			return true
		}
		if !review.Status.Allowed {
			c.log.Info("not watching Secret metadata: kubescribe may not "+verb+" Secrets cluster-wide (the default install grants only get by name); "+
				"changed credentials and kubeconfigs are read at the next periodic re-check", "recheck", "1m for a GitTarget's kubeconfig, 5m for a GitProvider's credentials")
			return false
		}
	}
	return true
}

// secretVersion is a Secret's resourceVersion as the metadata watch last saw it; "" when
// unknown (no watch, not synced, or no such Secret).
func (c *Controller) secretVersion(name types.NamespacedName) string {
	if c.secrets == nil {
		return ""
	}
	obj, ok, err := c.secrets.GetStore().GetByKey(name.Namespace + "/" + name.Name)
	if err != nil || !ok {
		return ""
	}
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return ""
	}
	return m.ResourceVersion
}

// enqueueTargetsOfSecret enqueues the GitTargets whose kubeconfig Secret is name, and the
// GitProviders whose credentials or signing key it holds.
func (c *Controller) enqueueTargetsOfSecret(name types.NamespacedName) {
	c.enqueueReferencing(kindProvider, name.Namespace, "secretRef", name.Name)
	c.enqueueReferencing(kindProvider, name.Namespace, "signing.secretRef", name.Name)
	c.enqueueReferencing(kindTarget, name.Namespace, "sourceCluster.kubeConfigSecretRef", name.Name)
}

// countBuild counts the clients built for a remote cluster's route.
func (c *Controller) countBuild(route string) {
	if c.sourceBuilds != nil {
		c.sourceBuilds.WithLabelValues(route).Inc()
	}
}
