// Package watch turns the objects WatchRules select into a stream of Changes in declared form.
// One stream runs per (GitTarget, resource, namespace scope); the Manager starts and stops them
// as the controller's desired set changes.
package watch

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// StreamSpec says what one stream mirrors.
type StreamSpec struct {
	// Cluster is the audit route of the source cluster.
	Cluster string
	// Target is the GitTarget the changes go to.
	Target types.NamespacedName
	GVR    schema.GroupVersionResource
	// Namespace limits the stream to one namespace; "" watches all (cluster-scoped resources).
	Namespace string
	// Operations selects which operations are emitted; empty means all.
	Operations []Op
}

func (s StreamSpec) key() string {
	return fmt.Sprintf("%s|%s|%s|%s", s.Cluster, s.Target, s.GVR, s.Namespace)
}

func (s StreamSpec) allows(op Op) bool {
	if len(s.Operations) == 0 {
		return true
	}
	for _, o := range s.Operations {
		if o == op {
			return true
		}
	}
	return false
}

// Render turns a live object into its declared-form manifest.
type Render func(*unstructured.Unstructured) ([]byte, error)

// stream is one running informer.
type stream struct {
	spec   StreamSpec
	render Render
	emit   func(Change)
	log    *slog.Logger

	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{}

	mu      sync.Mutex
	seen    map[types.UID][32]byte // uid -> hash of the last manifest emitted, for dedup
	lastErr error
}

func newStream(client dynamic.Interface, spec StreamSpec, render Render, emit func(Change), log *slog.Logger) *stream {
	s := &stream{
		spec:   spec,
		render: render,
		emit:   emit,
		log:    log.With("target", spec.Target.String(), "resource", spec.GVR.String(), "namespace", spec.Namespace),
		seen:   map[types.UID][32]byte{},
		done:   make(chan struct{}),
	}
	// No periodic resync: a resync re-delivers unchanged objects, which the dedup would only
	// have to discard again.
	s.informer = dynamicinformer.NewFilteredDynamicInformer(client, spec.GVR, spec.Namespace, 0, cache.Indexers{}, nil).Informer()
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

func (s *stream) run(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	go func() {
		defer close(s.done)
		s.informer.RunWithContext(ctx)
	}()
}

func (s *stream) stop() {
	s.cancel()
	<-s.done
}

func (s *stream) setErr(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	s.log.Warn("watch failed", "err", err)
}

func (s *stream) allows(op Op) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spec.allows(op)
}

// setOperations changes the operations emitted without restarting the watch.
func (s *stream) setOperations(ops []Op) {
	s.mu.Lock()
	s.spec.Operations = ops
	s.mu.Unlock()
}

// status reports whether the initial list is done and the last watch error, if any since.
func (s *stream) status() (synced bool, err error) {
	synced = s.informer.HasSynced()
	s.mu.Lock()
	defer s.mu.Unlock()
	if synced {
		s.lastErr = nil
	}
	return synced, s.lastErr
}

func (s *stream) onUpsert(obj any, op Op, initial bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	manifest, err := s.render(u)
	if err != nil {
		s.log.Error("cannot render the declared form; change skipped", "name", u.GetName(), "err", err)
		return
	}
	sum := sha256.Sum256(manifest)
	s.mu.Lock()
	prev, known := s.seen[u.GetUID()]
	s.seen[u.GetUID()] = sum
	s.mu.Unlock()
	if known && prev == sum {
		return // only server-side or status fields changed: nothing declared changed
	}
	// The initial list is the state to mirror, whatever operations the rules select.
	if !initial && !s.allows(op) {
		return
	}
	c := s.change(u, op)
	c.Manifest, c.Snapshot = manifest, initial
	s.emit(c)
}

// change describes an operation on u as this stream's Change, without a manifest.
func (s *stream) change(u *unstructured.Unstructured, op Op) Change {
	return Change{
		Cluster:         s.spec.Cluster,
		Target:          s.spec.Target,
		GVR:             s.spec.GVR,
		Namespace:       u.GetNamespace(),
		Name:            u.GetName(),
		UID:             string(u.GetUID()),
		ResourceVersion: u.GetResourceVersion(),
		Op:              op,
		Observed:        time.Now(),
	}
}

func (s *stream) onDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	s.mu.Lock()
	delete(s.seen, u.GetUID())
	s.mu.Unlock()
	if !s.allows(OpDelete) {
		return
	}
	s.emit(s.change(u, OpDelete))
}
