package watch

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// informerKey identifies a shared informer within a cluster.
type informerKey struct {
	gvr       schema.GroupVersionResource
	namespace string
}

// subscription is one GitTarget's view of a shared informer.
type subscription struct {
	target types.NamespacedName
	ops    []Op                   // empty: all
	seen   map[types.UID][32]byte // uid -> hash of the last manifest emitted, for dedup
	// primed is set once the target was handed the informer's state at subscription time.
	primed bool
}

func (s *subscription) allows(op Op) bool { return len(s.ops) == 0 || slices.Contains(s.ops, op) }

// sharedInformer is one running informer of a cluster, fanning its events out to the targets
// that subscribe to it.
type sharedInformer struct {
	cluster string
	key     informerKey
	render  Render
	emit    func(Change)
	metrics *Metrics
	log     *slog.Logger

	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{}

	// mu serialises event fan-out with subscription changes, so a new subscriber is handed
	// the informer's state exactly once, before any later event.
	mu      sync.Mutex
	subs    map[types.NamespacedName]*subscription
	lastErr error
}

func newSharedInformer(client dynamic.Interface, cluster string, key informerKey, opts RegistryOptions, log *slog.Logger) *sharedInformer {
	s := &sharedInformer{
		cluster: cluster,
		key:     key,
		render:  opts.Render,
		emit:    opts.Emit,
		metrics: opts.Metrics,
		log:     log.With("resource", key.gvr.String(), "namespace", key.namespace),
		subs:    map[types.NamespacedName]*subscription{},
		done:    make(chan struct{}),
	}
	// No periodic resync: a resync re-delivers unchanged objects, which the dedup would only
	// have to discard again.
	s.informer = dynamicinformer.NewFilteredDynamicInformer(client, key.gvr, key.namespace, 0, cache.Indexers{}, nil).Informer()
	_ = s.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		s.setErr(err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	_, _ = s.informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) { s.onUpsert(obj, OpCreate, isInInitialList) },
		UpdateFunc: func(oldObj, newObj any) {
			if o, ok := oldObj.(*unstructured.Unstructured); ok {
				if n, ok := newObj.(*unstructured.Unstructured); ok && o.GetResourceVersion() == n.GetResourceVersion() {
					return
				}
			}
			s.onUpsert(newObj, OpUpdate, false)
		},
		DeleteFunc: s.onDelete,
	})
	return s
}

func (s *sharedInformer) run(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	go func() {
		defer close(s.done)
		s.informer.RunWithContext(ctx)
	}()
}

func (s *sharedInformer) stop() {
	s.cancel()
	<-s.done
}

func (s *sharedInformer) setErr(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	s.log.Warn("watch failed", "err", err)
}

// setSubscriptions makes the subscribers exactly subs (target -> operations). A new
// subscriber is handed every object the informer already holds, as snapshot changes; the
// operations of an existing one change in place.
func (s *sharedInformer) setSubscriptions(subs map[types.NamespacedName][]Op) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for t := range s.subs {
		if _, ok := subs[t]; !ok {
			delete(s.subs, t)
		}
	}
	for t, ops := range subs {
		if sub, ok := s.subs[t]; ok {
			sub.ops = ops
			continue
		}
		sub := &subscription{target: t, ops: ops, seen: map[types.UID][32]byte{}}
		s.subs[t] = sub
		s.primeLocked(sub)
	}
}

// primeLocked hands a new subscriber the objects the informer's store holds. Events the
// handler has not delivered yet for those objects are then recognised by the dedup. Before the
// informer's initial list finished, the list's remaining objects reach the subscriber as they
// are delivered.
func (s *sharedInformer) primeLocked(sub *subscription) {
	for _, obj := range s.informer.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		manifest, err := s.render(u)
		if err != nil {
			s.log.Error("cannot render the declared form; object skipped", "name", u.GetName(), "err", err)
			continue
		}
		sub.seen[u.GetUID()] = sha256.Sum256(manifest)
		c := s.change(sub.target, u, OpCreate)
		c.Manifest, c.Snapshot = manifest, true
		s.emit(c)
	}
	sub.primed = true
}

// status reports whether target's subscription has its initial state, and the last watch
// error, if any since.
func (s *sharedInformer) status(target types.NamespacedName) (synced bool, err error) {
	synced = s.informer.HasSynced()
	s.mu.Lock()
	defer s.mu.Unlock()
	sub, ok := s.subs[target]
	synced = synced && ok && sub.primed
	if synced {
		s.lastErr = nil
	}
	return synced, s.lastErr
}

func (s *sharedInformer) onUpsert(obj any, op Op, initial bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	s.metrics.observed(s.cluster, s.key.gvr, op)
	manifest, err := s.render(u)
	if err != nil {
		s.log.Error("cannot render the declared form; change skipped", "name", u.GetName(), "err", err)
		return
	}
	sum := sha256.Sum256(manifest)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		prev, known := sub.seen[u.GetUID()]
		sub.seen[u.GetUID()] = sum
		if known && prev == sum {
			continue // only server-side or status fields changed: nothing declared changed
		}
		// The initial list is the state to mirror, whatever operations the rules select.
		if !initial && !sub.allows(op) {
			continue
		}
		c := s.change(sub.target, u, op)
		c.Manifest, c.Snapshot = manifest, initial
		s.emit(c)
	}
}

func (s *sharedInformer) onDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	s.metrics.observed(s.cluster, s.key.gvr, OpDelete)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		delete(sub.seen, u.GetUID())
		if sub.allows(OpDelete) {
			s.emit(s.change(sub.target, u, OpDelete))
		}
	}
}

// change describes an operation on u as a Change for target, without a manifest.
func (s *sharedInformer) change(target types.NamespacedName, u *unstructured.Unstructured, op Op) Change {
	return Change{
		Cluster:         s.cluster,
		Target:          target,
		GVR:             s.key.gvr,
		Namespace:       u.GetNamespace(),
		Name:            u.GetName(),
		UID:             string(u.GetUID()),
		ResourceVersion: u.GetResourceVersion(),
		Op:              op,
		Observed:        time.Now(),
	}
}
