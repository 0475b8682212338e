// Package watch owns the source side of the data flow, per cluster: a Registry holds one entry
// per source cluster (keyed by its audit route) with that cluster's clients, its discovery
// catalog, its shared informers and rule resolution. Owners (WatchRules) declare the streams
// they want; one informer runs per (resource, namespace scope) of a cluster, shared by every
// GitTarget that selects it, and each observed change leaves as a Change in declared form.
package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/kubescribe/kubescribe/internal/notify"
)

// StreamSpec says what one GitTarget wants of one resource of a cluster.
type StreamSpec struct {
	// Target is the GitTarget the changes go to.
	Target types.NamespacedName
	GVR    schema.GroupVersionResource
	// Namespace limits the stream to one namespace; "" watches all (cluster-scoped resources).
	Namespace string
	// Operations selects which operations are emitted; empty means all.
	Operations []Op
	// ExcludeFieldManagers suppresses creates and updates whose newest managedFields entry
	// names one of these managers (with tied entries, only when every tied manager is listed).
	ExcludeFieldManagers []string
	// ExcludeUsers suppresses changes attributed to one of these users; it travels with each
	// Change and is applied by the join, once the author is known.
	ExcludeUsers []string
	// Seal, when set, encrypts each object's declared form before its change leaves the watch
	// (a GitTarget's Secrets). One target has one Seal.
	Seal Sealer
}

// A Sealer encrypts objects' declared forms for a set of recipients.
type Sealer interface {
	// Seal returns the encrypted document of a declared form; two calls on one form may
	// differ (the encryption is randomized).
	Seal(plain []byte) ([]byte, error)
	// Recipients names who can read what Seal makes, sorted.
	Recipients() []string
}

// sealedFor is the recipients of seal, nil for none.
func sealedFor(seal Sealer) []string {
	if seal == nil {
		return nil
	}
	return seal.Recipients()
}

// sealPrint is the fingerprint of a set of recipients a cursor records for a sealed file (the
// recipients are public; the print only keeps the cursor short); "" for none.
func sealPrint(recipients []string) string {
	if len(recipients) == 0 {
		return ""
	}
	sum := sha256.Sum256([]byte(strings.Join(recipients, "\n")))
	return hex.EncodeToString(sum[:8])
}

// ownerWant is what one owner declared (Cluster.Set): the destination its target writes, and
// the streams it wants there.
type ownerWant struct {
	destination string
	specs       []StreamSpec
}

// subscriptionSpec is what the owners of one target want of one informer.
type subscriptionSpec struct {
	destination          string
	ops                  []Op
	excludeFieldManagers []string
	excludeUsers         []string
	seal                 Sealer
}

// merge adds another owner's wishes: the union of the operations, and only the exclusions
// both share (an owner that does not exclude a write wants it mirrored).
func (a subscriptionSpec) merge(b subscriptionSpec) subscriptionSpec {
	return subscriptionSpec{
		destination:          a.destination,          // one target has one destination
		seal:                 orSeal(a.seal, b.seal), // and one seal
		ops:                  unionOps(a.ops, b.ops),
		excludeFieldManagers: intersect(a.excludeFieldManagers, b.excludeFieldManagers),
		excludeUsers:         intersect(a.excludeUsers, b.excludeUsers),
	}
}

func orSeal(a, b Sealer) Sealer {
	if a != nil {
		return a
	}
	return b
}

func intersect(a, b []string) []string {
	var out []string
	for _, v := range a {
		if slices.Contains(b, v) && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func (s StreamSpec) informer() informerKey { return informerKey{gvr: s.GVR, namespace: s.Namespace} }

// Render turns a live object into its declared-form manifest.
type Render func(*unstructured.Unstructured) ([]byte, error)

// RegistryOptions configures a Registry.
type RegistryOptions struct {
	// Render produces the declared form of an object.
	Render Render
	// Emit receives every change of every cluster. It must not block for long: it is called
	// from the informers' handlers.
	Emit    func(Change)
	Logger  *slog.Logger
	Metrics *Metrics // may be nil
	// Resumable, when set, tells whether a stream, as it is subscribed, replays the events since
	// its cursor's trail (replay.go): only when the writer of its target's branch before this
	// process may have died holding changes it had not pushed, and only the first time the
	// stream is subscribed since (not when its cluster's clients are rebuilt, say). nil: always.
	Resumable func(stream StreamID) bool
	// Cursors holds the streams' resume cursors. nil: no resume; every start hands each
	// GitTarget the whole state as a snapshot and sweeps its folder.
	Cursors cursorSource
	// DiscoveryRefresh is how often each cluster's discovery catalog is re-read when no CRD or
	// APIService change triggered it sooner; DefaultDiscoveryRefresh when zero.
	DiscoveryRefresh time.Duration
	// SecretDigest, when set, gives a sealed change the keyed digest of its plaintext form as
	// its Digest, the one the admission tier keeps of a Secret's write, so that its candidate
	// can credit it; without it a sealed change has no digest.
	SecretDigest func(plain []byte) [32]byte
}

// Registry holds the source clusters. The local cluster is its first entry; a remote cluster
// is one more.
type Registry struct {
	opts RegistryOptions

	mu       sync.Mutex
	ctx      context.Context // nil before Start
	clusters map[string]*Cluster

	// changed holds the clusters whose catalog changed since the controller last took them.
	changed *notify.Set[string]
	// synced holds the targets one of whose streams finished handing its initial state over.
	synced *notify.Set[types.NamespacedName]
}

// NewRegistry returns a Registry; informers start once Start was called.
func NewRegistry(opts RegistryOptions) (*Registry, error) {
	switch {
	case opts.Render == nil:
		return nil, errors.New("watch: RegistryOptions.Render is required")
	case opts.Emit == nil:
		return nil, errors.New("watch: RegistryOptions.Emit is required")
	}
	if opts.DiscoveryRefresh < 0 {
		return nil, errors.New("watch: RegistryOptions.DiscoveryRefresh must not be negative")
	}
	if opts.DiscoveryRefresh == 0 {
		opts.DiscoveryRefresh = DefaultDiscoveryRefresh
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Registry{opts: opts, clusters: map[string]*Cluster{}, changed: notify.NewSet[string](),
		synced: notify.NewSet[types.NamespacedName]()}, nil
}

// Updates signals that the discovery catalog of some clusters changed, so rules resolved
// against it may resolve differently now; Changed then says which. Updates is never closed.
func (r *Registry) Updates() <-chan struct{} { return r.changed.C() }

// Changed returns, sorted, and forgets the clusters whose catalog changed since the last call.
func (r *Registry) Changed() []string {
	out := r.changed.Take()
	slices.Sort(out)
	return out
}

func (r *Registry) catalogChanged(cluster string) { r.changed.Mark(cluster) }

// Synced signals that some targets' streams finished handing their initial state over (a
// Status of their owners may have turned synced); SyncedTargets then says which. Never closed.
func (r *Registry) Synced() <-chan struct{} { return r.synced.C() }

// SyncedTargets returns, and forgets, the targets whose streams synced since the last call.
func (r *Registry) SyncedTargets() []types.NamespacedName { return r.synced.Take() }

// AddCluster registers a source cluster under its audit route. The discovery client should
// cache (a discovery.CachedDiscoveryInterface is invalidated when a resource is not found).
func (r *Registry) AddCluster(name string, client dynamic.Interface, dc discovery.DiscoveryInterface) (*Cluster, error) {
	if name == "" || client == nil || dc == nil {
		return nil, errors.New("watch: a cluster needs a name, a dynamic client and a discovery client")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.clusters[name]; ok {
		return nil, fmt.Errorf("watch: cluster %q is already registered", name)
	}
	c := &Cluster{
		name:      name,
		client:    client,
		discovery: dc,
		opts:      r.opts,
		log:       r.opts.Logger.With("cluster", name),
		owners:    map[string]ownerWant{},
		informers: map[informerKey]*sharedInformer{},
		cat: catalogState{
			ctx:      context.Background(),
			kick:     make(chan struct{}, 1),
			triggers: map[schema.GroupVersionResource]context.CancelFunc{},
			watchOff: map[schema.GroupVersionResource]bool{},
			done:     make(chan struct{}),
		},
		notify:       func() { r.catalogChanged(name) },
		streamSynced: func(t types.NamespacedName) { r.synced.Mark(t) },
	}
	r.clusters[name] = c
	if r.ctx != nil {
		c.start(r.ctx)
	}
	return c, nil
}

// ReplaceCluster gives a registered cluster new clients (its kubeconfig changed): the old
// entry's informers and discovery stop, and a new entry with the new clients takes over the
// streams its owners want. They resume from their cursors as after a restart. It registers the
// cluster when it is not registered.
func (r *Registry) ReplaceCluster(name string, client dynamic.Interface, dc discovery.DiscoveryInterface) (*Cluster, error) {
	old := r.detach(name)
	var owners map[string]ownerWant
	if old != nil {
		old.mu.Lock()
		owners = old.owners
		old.mu.Unlock()
		old.stop()
	}
	c, err := r.AddCluster(name, client, dc)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for owner, w := range owners {
		c.owners[owner] = w
	}
	c.reconcileLocked()
	return c, nil
}

// RemoveCluster stops a cluster's informers and discovery and forgets it; it reports whether
// the cluster was registered. No change of it is emitted after it returns.
func (r *Registry) RemoveCluster(name string) bool {
	c := r.detach(name)
	if c == nil {
		return false
	}
	c.stop()
	return true
}

// detach unregisters a cluster without stopping it.
func (r *Registry) detach(name string) *Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.clusters[name]
	delete(r.clusters, name)
	return c
}

// Names lists the registered clusters, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.clusters))
}

// Cluster returns the entry of a source cluster, or nil.
func (r *Registry) Cluster(name string) *Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clusters[name]
}

// Start makes every cluster run its informers under ctx.
func (r *Registry) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctx = ctx
	for _, c := range r.clusters {
		c.start(ctx)
	}
}

// Stop stops every informer of every cluster and waits for them: no change is emitted after it
// returns.
func (r *Registry) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.clusters {
		c.stop()
	}
}

// Cluster is one source cluster's entry: its clients, discovery catalog and informers, and the
// streams its owners want.
type Cluster struct {
	name      string
	client    dynamic.Interface
	discovery discovery.DiscoveryInterface
	opts      RegistryOptions
	log       *slog.Logger

	mu        sync.Mutex
	ctx       context.Context
	stopped   bool
	owners    map[string]ownerWant
	informers map[informerKey]*sharedInformer

	// cat is the discovery catalog; its refresh loop runs from start until stop.
	cat           catalogState
	notify        func()
	stopDiscovery context.CancelFunc
	// streamSynced is told of each target whose subscription finished its initial state.
	streamSynced func(types.NamespacedName)
}

// Name is the cluster's audit route.
func (c *Cluster) Name() string { return c.name }

func (c *Cluster) start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ctx = ctx
	if c.stopDiscovery == nil && !c.stopped {
		dctx, cancel := context.WithCancel(ctx)
		c.stopDiscovery = cancel
		c.cat.mu.Lock()
		c.cat.ctx = dctx
		c.cat.mu.Unlock()
		go c.runDiscovery(dctx, c.opts.DiscoveryRefresh, c.notify)
	}
	c.reconcileLocked()
}

func (c *Cluster) stop() {
	c.mu.Lock()
	stopDiscovery := c.stopDiscovery
	c.mu.Unlock()
	if stopDiscovery != nil {
		stopDiscovery()
		<-c.cat.done
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	for k, inf := range c.informers {
		inf.stop()
		delete(c.informers, k)
	}
	c.owners = map[string]ownerWant{}
	c.opts.Metrics.setInformers(c.name, 0)
}

// Set declares the streams owner wants, replacing what it wanted before, and the destination
// they write: the target's branch and folder (its route), "" for none. The destination is part
// of each stream's identity and of its resume cursor: when it changes, the target is handed the
// whole state again, as for a new stream, and the new folder is swept. Set with no streams
// still records the destination: the owner follows it with nothing to watch (Following).
func (c *Cluster) Set(owner, destination string, specs []StreamSpec) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.owners[owner] = ownerWant{destination: destination, specs: specs}
	c.reconcileLocked()
}

// Following returns the destination owner last declared in this cluster (Set), and whether it
// declared any since it was removed.
func (c *Cluster) Following(owner string) (destination string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.owners[owner]
	return w.destination, ok
}

// Streams returns every stream its owners want (a copy), owner by owner in no set order.
func (c *Cluster) Streams() []StreamSpec {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []StreamSpec
	for _, w := range c.owners {
		out = append(out, w.specs...)
	}
	return out
}

// Remove forgets owner; informers nobody else wants stop.
func (c *Cluster) Remove(owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.owners[owner]; !ok {
		return // nothing changes: rules ask every other cluster to forget them at each evaluation
	}
	delete(c.owners, owner)
	c.reconcileLocked()
}

// Replay hands target its whole state again, on every stream of this cluster it subscribes
// to, as a restart would: each stream resumes from its cursor, so an object the cursor holds in
// its version comes as Unchanged, one changed since the last push as Resumed, and a sweep
// follows. The writer asks for it when the branch no longer holds what was pushed (a branch
// started over, someone else's commits in the folder). It returns the number of streams
// replayed.
func (c *Cluster) Replay(target types.NamespacedName) int { return c.replay(target, false) }

// replay hands target its whole state again on every stream of this cluster it subscribes to,
// after the events since each stream's trail when fromTrail; it returns the number of streams.
func (c *Cluster) replay(target types.NamespacedName, fromTrail bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, inf := range c.informers {
		if inf.replay(target, fromTrail) {
			n++
		}
	}
	return n
}

// Resume has target's streams, in every cluster, start again as streams whose previous writer
// was lost (RegistryOptions.Resumable): each replays the events since its trail, then hands the
// state over from its cursor. The controller asks for it when this replica writes a branch
// again whose changes the writer before it may have dropped, and the streams had not stopped
// meanwhile. It returns the number of streams resumed.
func (r *Registry) Resume(target types.NamespacedName) int {
	r.mu.Lock()
	clusters := make([]*Cluster, 0, len(r.clusters))
	for _, c := range r.clusters {
		clusters = append(clusters, c)
	}
	r.mu.Unlock()
	n := 0
	for _, c := range clusters {
		n += c.replay(target, true)
	}
	return n
}

// Replay has target's streams in cluster hand their state over again (Cluster.Replay); it
// returns the number of streams replayed, 0 for a cluster it does not know.
func (r *Registry) Replay(cluster string, target types.NamespacedName) int {
	c := r.Cluster(cluster)
	if c == nil {
		return 0
	}
	return c.Replay(target)
}

// Status reports whether every stream owner wants has delivered its initial state, and the
// first watch error among them.
func (c *Cluster) Status(owner string) (synced bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	synced = true
	for _, spec := range c.owners[owner].specs {
		inf, ok := c.informers[spec.informer()]
		if !ok {
			return false, nil
		}
		ok, ierr := inf.status(spec.Target)
		synced = synced && ok
		if err == nil {
			err = ierr
		}
	}
	return synced, err
}

// reconcileLocked makes the running informers and their subscriptions match what the owners
// want. Two owners wanting the same target and resource share one subscription whose
// operations are the union.
func (c *Cluster) reconcileLocked() {
	if c.ctx == nil || c.stopped {
		return
	}
	want := map[informerKey]map[types.NamespacedName]subscriptionSpec{}
	for _, w := range c.owners {
		for _, spec := range w.specs {
			ik := spec.informer()
			subs := want[ik]
			if subs == nil {
				subs = map[types.NamespacedName]subscriptionSpec{}
				want[ik] = subs
			}
			sub := subscriptionSpec{
				destination:          w.destination,
				ops:                  slices.Clone(spec.Operations),
				excludeFieldManagers: slices.Clone(spec.ExcludeFieldManagers),
				excludeUsers:         slices.Clone(spec.ExcludeUsers),
				seal:                 spec.Seal,
			}
			if prev, ok := subs[spec.Target]; ok {
				sub = prev.merge(sub)
			}
			subs[spec.Target] = sub
		}
	}
	for k, inf := range c.informers {
		if _, ok := want[k]; !ok {
			inf.stop()
			delete(c.informers, k)
			c.log.Info("stopped watch", "resource", k.gvr.String(), "namespace", k.namespace)
		}
	}
	for k, subs := range want {
		inf, ok := c.informers[k]
		if !ok {
			inf = newSharedInformer(c.client, c.name, k, c.opts, c.streamSynced, c.log)
			c.informers[k] = inf
			inf.run(c.ctx)
			c.log.Info("started watch", "resource", k.gvr.String(), "namespace", k.namespace)
		}
		inf.setSubscriptions(subs)
	}
	c.opts.Metrics.setInformers(c.name, len(c.informers))
}

// unionOps merges two operation sets; empty means all and absorbs the other.
func unionOps(a, b []Op) []Op {
	if len(a) == 0 || len(b) == 0 {
		return nil
	}
	out := slices.Clone(a)
	for _, op := range b {
		if !slices.Contains(out, op) {
			out = append(out, op)
		}
	}
	slices.Sort(out)
	return out
}
