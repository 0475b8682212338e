package watch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// The informers keep compact objects. A stream needs of a live object only its identity, its
// declared form and who last wrote it; an informer's store of full objects (a 10,000-ConfigMap
// list is ~55 MB of maps) would hold much more. The transform renders the declared form once,
// when the object arrives, and keeps a compactObject:
//
//	apiVersion, kind, metadata.{name, namespace, uid, resourceVersion, deletionTimestamp},
//	the field managers of the newest write, the rendered manifest (or the render error).
//
// Every allocation of a compact object stays in the heap as long as the object, and a stream
// replaces the objects one at a time, among the garbage of decoding its events: a small
// allocation that outlives its neighbours keeps their page of the heap in use. So a compact
// object is a single allocation of 256 bytes: a struct with only the fields a stream reads,
// rather than maps or the 232-byte ObjectMeta, whose uid, name and resourceVersion are stored
// in the struct itself when they fit (compactIdentityBytes; one more allocation when they do
// not); its manifest is packed with others' (arena.go). Values that many objects share
// (apiVersion, kind, namespace, the writers) are stored once per informer (interned).
// It implements metav1.Object, which client-go's store and reflector read; setters of fields
// it does not keep do nothing.
type compactObject struct {
	metav1.TypeMeta
	Name, Namespace string
	UID             types.UID
	ResourceVersion string
	// DeletionTimestamp is set while the object is being deleted.
	DeletionTimestamp *metav1.Time
	// Annotations are only a bookmark's (the reflector reads the end of a watch-list's
	// initial events there).
	Annotations map[string]string
	// writers are the field managers of the newest write, joined by writersSep.
	writers string
	// manifest is the declared form, unless rendering it failed with renderError.
	manifest, renderError string
	// identity holds UID, Name and ResourceVersion when they fit.
	identity [compactIdentityBytes]byte
}

// compactIdentityBytes is the room in a compact object for its uid (36 bytes), name and
// resourceVersion: names up to about 50 bytes fit, and the struct is 256 bytes, a size class
// of Go's allocator.
const compactIdentityBytes = 96

// writersSep joins a compact object's writers: no manager name contains it.
const writersSep = "\x00"

// setIdentity stores uid, name and resourceVersion in one piece of memory: the object's own
// when they fit.
func (o *compactObject) setIdentity(uid, name, rv string) {
	n := len(uid) + len(name) + len(rv)
	var b []byte
	if n <= len(o.identity) {
		b = o.identity[:0:n]
	} else {
		b = make([]byte, 0, n)
	}
	b = append(append(append(b, uid...), name...), rv...)
	all := unsafe.String(unsafe.SliceData(b), n) // never written again
	o.UID = types.UID(all[:len(uid)])
	o.Name, o.ResourceVersion = all[len(uid):len(uid)+len(name)], all[len(uid)+len(name):]
}

func (o *compactObject) DeepCopyObject() runtime.Object {
	c := *o // the strings stay views of o's identity, which they keep alive
	if o.DeletionTimestamp != nil {
		t := *o.DeletionTimestamp
		c.DeletionTimestamp = &t
	}
	c.Annotations = maps.Clone(o.Annotations)
	return &c
}

// The metav1.Object of a compact object.

func (o *compactObject) GetNamespace() string                          { return o.Namespace }
func (o *compactObject) SetNamespace(namespace string)                 { o.Namespace = namespace }
func (o *compactObject) GetName() string                               { return o.Name }
func (o *compactObject) SetName(name string)                           { o.Name = name }
func (o *compactObject) GetGenerateName() string                       { return "" }
func (o *compactObject) SetGenerateName(string)                        {}
func (o *compactObject) GetUID() types.UID                             { return o.UID }
func (o *compactObject) SetUID(uid types.UID)                          { o.UID = uid }
func (o *compactObject) GetResourceVersion() string                    { return o.ResourceVersion }
func (o *compactObject) SetResourceVersion(version string)             { o.ResourceVersion = version }
func (o *compactObject) GetGeneration() int64                          { return 0 }
func (o *compactObject) SetGeneration(int64)                           {}
func (o *compactObject) GetSelfLink() string                           { return "" }
func (o *compactObject) SetSelfLink(string)                            {}
func (o *compactObject) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (o *compactObject) SetCreationTimestamp(metav1.Time)              {}
func (o *compactObject) GetDeletionTimestamp() *metav1.Time            { return o.DeletionTimestamp }
func (o *compactObject) SetDeletionTimestamp(t *metav1.Time)           { o.DeletionTimestamp = t }
func (o *compactObject) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (o *compactObject) SetDeletionGracePeriodSeconds(*int64)          {}
func (o *compactObject) GetLabels() map[string]string                  { return nil }
func (o *compactObject) SetLabels(map[string]string)                   {}
func (o *compactObject) GetAnnotations() map[string]string             { return o.Annotations }
func (o *compactObject) SetAnnotations(a map[string]string)            { o.Annotations = a }
func (o *compactObject) GetFinalizers() []string                       { return nil }
func (o *compactObject) SetFinalizers([]string)                        {}
func (o *compactObject) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (o *compactObject) SetOwnerReferences([]metav1.OwnerReference)    {}
func (o *compactObject) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (o *compactObject) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

// compactList is a page of a list, compacted.
type compactList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []*compactObject
}

func (l *compactList) DeepCopyObject() runtime.Object {
	c := &compactList{TypeMeta: l.TypeMeta, Items: make([]*compactObject, len(l.Items))}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	for i, o := range l.Items {
		c.Items[i] = o.DeepCopyObject().(*compactObject)
	}
	return c
}

// internMax bounds the values an informer's transform interns (namespaces, manager sets):
// beyond it, values are stored per object.
const internMax = 4096

// interner stores each distinct string once.
type interner struct {
	mu     sync.Mutex
	values map[string]string
}

func (in *interner) intern(s string) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.values[s]; ok {
		return v
	}
	if in.values == nil {
		in.values = map[string]string{}
	}
	s = strings.Clone(s) // not a view of the decoded object
	if len(in.values) < internMax {
		in.values[s] = s
	}
	return s
}

// compactor turns an informer's full objects into compact ones.
type compactor struct {
	render Render
	in     interner
	arena  manifestArena
	// gvr and namespace are what the informer watches: an object outside them (which only a
	// non-conformant server sends) is refused before it is kept, and reported to refused.
	gvr       schema.GroupVersionResource
	namespace string
	refused   func(u *unstructured.Unstructured, reason string)
}

// The reasons an object an informer received is refused (kubescribe_watch_objects_refused_total).
const (
	// RefusedNamespace: a namespaced informer received an object of another namespace.
	RefusedNamespace = "namespace"
	// RefusedGroup: the object's apiVersion is not of the watched resource's API group.
	RefusedGroup = "group"
)

// outOfScope says why u is not an object of the informer's resource and namespace, or "".
func (c *compactor) outOfScope(u *unstructured.Unstructured) string {
	if c.namespace != "" && u.GetNamespace() != c.namespace {
		return RefusedNamespace
	}
	if av := u.GetAPIVersion(); av != "" {
		if gv, err := schema.ParseGroupVersion(av); err != nil || gv.Group != c.gvr.Group {
			return RefusedGroup
		}
	}
	return ""
}

// admit reports whether u is in the informer's scope, reporting it when it is not.
func (c *compactor) admit(u *unstructured.Unstructured) bool {
	reason := c.outOfScope(u)
	if reason != "" && c.refused != nil {
		c.refused(u, reason)
	}
	return reason == ""
}

func (c *compactor) compact(u *unstructured.Unstructured) *compactObject {
	o := &compactObject{TypeMeta: metav1.TypeMeta{APIVersion: c.in.intern(u.GetAPIVersion()), Kind: c.in.intern(u.GetKind())}}
	if ns := u.GetNamespace(); ns != "" {
		o.Namespace = c.in.intern(ns)
	}
	if dt := u.GetDeletionTimestamp(); dt != nil {
		o.DeletionTimestamp = dt // held in deletion: the join needs the version before it
	}
	if newest := newestWriters(u.GetManagedFields()); len(newest) > 0 {
		managers := make([]string, len(newest))
		for i, e := range newest {
			managers[i] = e.Manager
		}
		o.writers = c.in.intern(strings.Join(managers, writersSep))
	}
	manifest, err := c.render(u)
	if err != nil {
		o.renderError = err.Error()
		manifest = nil
	}
	o.setIdentity(string(u.GetUID()), u.GetName(), u.GetResourceVersion())
	o.manifest = c.arena.add(manifest)
	return o
}

// compactEvent compacts a watch event's object. A bookmark keeps its resourceVersion and
// annotations (the reflector reads the end of a watch-list's initial events there). An event
// of an object outside the informer's scope is dropped (false).
func (c *compactor) compactEvent(e watch.Event) (watch.Event, bool) {
	u, ok := e.Object.(*unstructured.Unstructured)
	switch {
	case e.Type == watch.Error || !ok:
		return e, true
	case e.Type == watch.Bookmark:
		o := &compactObject{TypeMeta: metav1.TypeMeta{APIVersion: u.GetAPIVersion(), Kind: u.GetKind()}}
		o.ResourceVersion, o.Annotations = u.GetResourceVersion(), u.GetAnnotations()
		e.Object = o
	case !c.admit(u):
		return e, false
	default:
		e.Object = c.compact(u)
	}
	return e, true
}

// compactList compacts a page of a list.
func (c *compactor) compactList(obj runtime.Object) (runtime.Object, error) {
	l, ok := obj.(*unstructured.UnstructuredList)
	if !ok {
		return nil, fmt.Errorf("a list of %T, not of unstructured objects", obj)
	}
	out := &compactList{Items: make([]*compactObject, 0, len(l.Items))}
	out.ResourceVersion, out.Continue, out.RemainingItemCount = l.GetResourceVersion(), l.GetContinue(), l.GetRemainingItemCount()
	for i := range l.Items {
		if c.admit(&l.Items[i]) {
			out.Items = append(out.Items, c.compact(&l.Items[i]))
		}
		l.Items[i] = unstructured.Unstructured{} // the full object can go before the page is done
	}
	return out, nil
}

// managers returns the field managers of the newest write that is not a status write.
func (o *compactObject) managers() []string {
	if o.writers == "" {
		return nil
	}
	return strings.Split(o.writers, writersSep)
}

// manifestOf returns the declared form a compact object carries, as a read-only view of the
// cached string rather than a copy: a 10,000-object snapshot would otherwise hold every
// manifest twice until it is committed.
func manifestOf(o *compactObject) ([]byte, error) {
	if o.renderError != "" {
		return nil, errors.New(o.renderError)
	}
	if o.manifest == "" {
		return []byte{}, nil
	}
	return unsafe.Slice(unsafe.StringData(o.manifest), len(o.manifest)), nil
}

// newCompactInformer is dynamicinformer.NewFilteredDynamicInformer with compact objects from
// the source on: list items and watch events are compacted as they arrive, before the reflector
// keeps them. A watch-list's initial events, which client-go's reflector gathers before it hands
// them to the informer, then never hold 10,000 full objects at once.
func newCompactInformer(client dynamic.Interface, gvr schema.GroupVersionResource, namespace string, c *compactor) cache.SharedIndexInformer {
	res := client.Resource(gvr).Namespace(namespace)
	list := func(obj runtime.Object, err error) (runtime.Object, error) {
		if err != nil {
			return nil, err
		}
		return c.compactList(obj)
	}
	watchCompact := func(w watch.Interface, err error) (watch.Interface, error) {
		if err != nil {
			return nil, err
		}
		return watch.Filter(w, c.compactEvent), nil
	}
	lw := &cache.ListWatch{
		ListFunc: func(options metav1.ListOptions) (runtime.Object, error) {
			return list(res.List(context.Background(), paged(options)))
		},
		WatchFunc: func(options metav1.ListOptions) (watch.Interface, error) {
			return watchCompact(res.Watch(context.Background(), options))
		},
		ListWithContextFunc: func(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
			return list(res.List(ctx, paged(options)))
		},
		WatchFuncWithContext: func(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
			return watchCompact(res.Watch(ctx, options))
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&compactObject{}, cache.SharedIndexInformerOptions{ObjectDescription: gvr.String()})
}

// listPageSize is the page size of the lists paged makes: client-go's pager default.
const listPageSize = 500

// paged turns the first request of a list into a paginated one. The reflector lists only when
// the apiserver cannot stream the initial state (watch-list needs etcd's progress requests,
// which etcd before 3.4.31 and 3.5.13 lacks); it asks for resourceVersion "0" or the version
// it last saw, which the apiserver answers from its watch cache in one response, ignoring the
// limit: 10,000 ConfigMaps are then ~15 MB of JSON and its decoded objects, all held before
// one is compacted. A paginated read of the latest state (resourceVersion "") is answered page
// by page, each page compacted before the next is fetched; the reflector watches on from the
// version it returns, which is never older than the one it asked for. Continuation requests
// are left as they are.
func paged(options metav1.ListOptions) metav1.ListOptions {
	if options.Continue != "" {
		return options
	}
	options.ResourceVersion, options.ResourceVersionMatch = "", ""
	if options.Limit == 0 || options.Limit > listPageSize {
		options.Limit = listPageSize
	}
	return options
}

// newestWriters returns the managedFields entries of the newest write that is not a status
// write (several when managers share its one-second time): all write exclusion reads
// (newestManagersExcluded). Keeping only those keeps a compact object's size independent of
// how many managers ever wrote the object.
func newestWriters(mf []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	var newest []metav1.ManagedFieldsEntry
	for _, e := range mf {
		if e.Subresource == "status" || e.Time == nil {
			continue
		}
		switch {
		case len(newest) == 0 || newest[0].Time.Before(e.Time):
			newest = append(newest[:0], e)
		case e.Time.Equal(newest[0].Time):
			newest = append(newest, e)
		}
	}
	return newest
}
