package watch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// The informers keep compact objects. A stream needs of a live object only its identity, its
// declared form and who last wrote it; an informer's store of full objects (a 10,000-ConfigMap
// list is ~55 MB of maps) would hold much more. The transform renders the declared form once,
// when the object arrives, and keeps:
//
//	apiVersion, kind, metadata.{name, namespace, uid, resourceVersion, deletionTimestamp},
//	the field managers of the newest write (newestWriters), the rendered manifest (or the
//	render error), the last two under keys no API object has.
//
// Every allocation of a compact object stays in the heap as long as the object, and a stream
// replaces the objects one at a time, leaving the heap's pages partly used: values that many
// objects share (apiVersion, kind, namespace, the writers) are stored once per informer
// (interned), and the writers are one string rather than a list of maps.
const (
	manifestKey    = "\x00kubescribe:manifest"
	renderErrorKey = "\x00kubescribe:render-error"
	// writersKey holds the field managers of the newest write, joined by writersSep.
	writersKey = "\x00kubescribe:writers"
	writersSep = "\x00"
)

// internMax bounds the values an informer's transform interns (namespaces, manager sets):
// beyond it, values are stored per object.
const internMax = 4096

// interner stores each distinct string once, boxed, so that putting it in an object's map
// allocates nothing.
type interner struct {
	mu     sync.Mutex
	values map[string]any
}

func (in *interner) box(s string) any {
	in.mu.Lock()
	defer in.mu.Unlock()
	if v, ok := in.values[s]; ok {
		return v
	}
	if in.values == nil {
		in.values = map[string]any{}
	}
	if len(in.values) >= internMax {
		return s
	}
	s = strings.Clone(s) // not a view of the decoded object
	v := any(s)
	in.values[s] = v
	return v
}

// compactTransform is the informers' cache.TransformFunc.
func compactTransform(render Render) cache.TransformFunc {
	var in interner
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil // a tombstone holds an object that was transformed already
		}
		if _, done := u.Object[manifestKey]; done {
			return u, nil
		}
		meta := map[string]any{"name": u.GetName(), "uid": string(u.GetUID()), "resourceVersion": u.GetResourceVersion()}
		if ns := u.GetNamespace(); ns != "" {
			meta["namespace"] = in.box(ns)
		}
		if dt, ok, _ := unstructured.NestedString(u.Object, "metadata", "deletionTimestamp"); ok && dt != "" {
			meta["deletionTimestamp"] = dt // held in deletion: the join needs the version before it
		}
		out := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": in.box(u.GetAPIVersion()),
			"kind":       in.box(u.GetKind()),
			"metadata":   meta,
		}}
		if newest := newestWriters(u.GetManagedFields()); len(newest) > 0 {
			managers := make([]string, len(newest))
			for i, e := range newest {
				managers[i] = e.Manager
			}
			out.Object[writersKey] = in.box(strings.Join(managers, writersSep))
		}
		manifest, err := render(u)
		if err != nil {
			out.Object[renderErrorKey] = err.Error()
		} else {
			out.Object[manifestKey] = string(manifest)
		}
		return out, nil
	}
}

// newestManagers returns the field managers of u's newest write that is not a status write:
// from a compact object's writers, or from a full object's managedFields.
func newestManagers(u *unstructured.Unstructured) []string {
	if w, ok := u.Object[writersKey].(string); ok {
		return strings.Split(w, writersSep)
	}
	var managers []string
	for _, e := range newestWriters(u.GetManagedFields()) {
		managers = append(managers, e.Manager)
	}
	return managers
}

// manifestOf returns the declared form a compact object carries, as a read-only view of the
// cached string rather than a copy: a 10,000-object snapshot would otherwise hold every
// manifest twice until it is committed.
func manifestOf(u *unstructured.Unstructured) ([]byte, error) {
	if m, ok := u.Object[manifestKey].(string); ok {
		if m == "" {
			return []byte{}, nil
		}
		return unsafe.Slice(unsafe.StringData(m), len(m)), nil
	}
	if e, ok := u.Object[renderErrorKey].(string); ok {
		return nil, errors.New(e)
	}
	return nil, errors.New("the object carries no declared form")
}

// newCompactInformer is dynamicinformer.NewFilteredDynamicInformer with compact objects from
// the source on: list items and watch events are compacted as they arrive, before the reflector
// keeps them. A watch-list's initial events, which client-go's reflector gathers before it hands
// them to the informer, then never hold 10,000 full objects at once.
func newCompactInformer(client dynamic.Interface, gvr schema.GroupVersionResource, namespace string, render Render) cache.SharedIndexInformer {
	res := client.Resource(gvr).Namespace(namespace)
	transform := compactTransform(render)
	compactList := func(obj runtime.Object, err error) (runtime.Object, error) {
		if err != nil {
			return nil, err
		}
		if l, ok := obj.(*unstructured.UnstructuredList); ok {
			for i := range l.Items {
				c, _ := transform(&l.Items[i]) // never fails: a render error is kept in the object
				l.Items[i] = *c.(*unstructured.Unstructured)
			}
		}
		return obj, nil
	}
	compactWatch := func(w watch.Interface, err error) (watch.Interface, error) {
		if err != nil {
			return nil, err
		}
		return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if e.Type == watch.Bookmark || e.Type == watch.Error {
				return e, true // a bookmark's annotations tell the reflector where the initial events end
			}
			if u, ok := e.Object.(*unstructured.Unstructured); ok {
				c, _ := transform(u)
				e.Object = c.(*unstructured.Unstructured)
			}
			return e, true
		}), nil
	}
	lw := &cache.ListWatch{
		ListFunc: func(options metav1.ListOptions) (runtime.Object, error) {
			return compactList(res.List(context.Background(), paged(options)))
		},
		WatchFunc: func(options metav1.ListOptions) (watch.Interface, error) {
			return compactWatch(res.Watch(context.Background(), options))
		},
		ListWithContextFunc: func(ctx context.Context, options metav1.ListOptions) (runtime.Object, error) {
			return compactList(res.List(ctx, paged(options)))
		},
		WatchFuncWithContext: func(ctx context.Context, options metav1.ListOptions) (watch.Interface, error) {
			return compactWatch(res.Watch(ctx, options))
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ObjectDescription: gvr.String()})
}

// listPageSize is the page size of the lists paged makes: client-go's pager default.
const listPageSize = 500

// paged turns the first request of a list into a paginated one. The reflector lists only when
// the apiserver cannot stream the initial state (watch-list needs etcd's progress requests,
// which etcd 3.4 lacks); it asks for resourceVersion "0" or the version it last saw, which the
// apiserver answers from its watch cache in one response, ignoring the limit: 10,000 ConfigMaps
// are then ~15 MB of JSON and its decoded objects, all held before one is compacted. A
// paginated read of the latest state (resourceVersion "") is answered page by page, each page
// compacted before the next is fetched; the reflector watches on from the version it returns,
// which is never older than the one it asked for. Continuation requests are left as they are.
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
