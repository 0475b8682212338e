package watch

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// DefaultDiscoveryRefresh is how often a cluster's discovery catalog is re-read when nothing
// triggered it sooner.
const DefaultDiscoveryRefresh = 5 * time.Minute

// The resources whose changes trigger a discovery refresh, watched only where the cluster serves
// them with list and watch.
var (
	CRDsResource        = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	APIServicesResource = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
)

var triggerResources = []schema.GroupVersionResource{CRDsResource, APIServicesResource}

// settleDelays are the extra refreshes after a trigger that changed nothing: a CRD's events
// (created, then established) can come before discovery serves it.
var settleDelays = []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second}

// catalogState is a cluster's discovery catalog and what keeps it fresh.
type catalogState struct {
	mu      sync.Mutex
	catalog *Catalog
	err     error // of the last refresh
	// ctx bounds a read of discovery made outside the refresh loop (Cluster.Catalog): it ends
	// when the cluster stops.
	ctx context.Context

	// kick asks the refresh loop for a refresh (capacity 1: requests coalesce).
	kick chan struct{}
	// triggers are the running CRD/APIService informers, by resource; watchOff records the
	// trigger resources the cluster does not serve, to log the state once per change.
	triggers map[schema.GroupVersionResource]context.CancelFunc
	watchOff map[schema.GroupVersionResource]bool
	done     chan struct{}
}

// Catalog returns the cluster's current discovery catalog, reading it first if it was never
// read (or the last read failed).
func (c *Cluster) Catalog() (*Catalog, error) {
	c.cat.mu.Lock()
	defer c.cat.mu.Unlock()
	if c.cat.catalog == nil {
		c.refreshLocked(c.cat.ctx)
	}
	if c.cat.catalog != nil {
		return c.cat.catalog, nil // a failed refresh keeps the last catalog
	}
	return nil, c.cat.err
}

// Resolve maps selectors to resources through the cluster's current discovery catalog; see
// Catalog.Resolve. It fails only when the catalog could never be read.
func (c *Cluster) Resolve(selectors []Selector, namespacedOnly bool) (Resolution, error) {
	cat, err := c.Catalog()
	if cat == nil {
		return Resolution{}, err
	}
	return cat.Resolve(selectors, namespacedOnly), nil
}

// RequestRefresh asks for the discovery catalog to be re-read soon; requests coalesce.
func (c *Cluster) RequestRefresh() {
	select {
	case c.cat.kick <- struct{}{}:
	default:
	}
}

// refreshLocked re-reads discovery; it reports whether a catalog read before changed (the first
// read changes nothing anyone resolved against). A failed read keeps the last catalog.
func (c *Cluster) refreshLocked(ctx context.Context) bool {
	if cd, ok := c.discovery.(discovery.CachedDiscoveryInterface); ok {
		cd.Invalidate()
	}
	cat, err := NewCatalog(ctx, c.discovery)
	c.cat.err = err
	if err != nil {
		c.log.Warn("discovery refresh failed; keeping the last catalog", "err", err)
		c.opts.Metrics.refreshed(c.name, refreshFailed)
		return false
	}
	first := c.cat.catalog == nil
	changed := !first && c.cat.catalog.fingerprint != cat.fingerprint
	c.cat.catalog = cat
	switch {
	case changed:
		c.opts.Metrics.refreshed(c.name, refreshChanged)
	case !first:
		c.opts.Metrics.refreshed(c.name, refreshUnchanged)
	}
	return changed
}

// runDiscovery keeps the catalog fresh until ctx ends: on a timer, on request, and after every
// change of a CRD or APIService where the cluster serves those. A change is announced through
// notify.
func (c *Cluster) runDiscovery(ctx context.Context, every time.Duration, notify func()) {
	defer close(c.cat.done)
	defer c.stopTriggers()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var settle *time.Timer
	settleStep := len(settleDelays)
	refresh := func(kicked bool) {
		c.cat.mu.Lock()
		changed := c.refreshLocked(ctx)
		cat := c.cat.catalog
		c.cat.mu.Unlock()
		c.syncTriggers(ctx, cat)
		if changed {
			c.log.Debug("discovery catalog changed")
			notify()
		}
		if kicked {
			settleStep = 0
		}
		if !changed && settleStep < len(settleDelays) {
			if settle == nil {
				settle = time.NewTimer(settleDelays[settleStep])
			} else {
				settle.Reset(settleDelays[settleStep])
			}
			settleStep++
		} else if changed {
			settleStep = len(settleDelays)
		}
	}
	refresh(false)
	for {
		var settleC <-chan time.Time
		if settle != nil {
			settleC = settle.C
		}
		select {
		case <-ctx.Done():
			if settle != nil {
				settle.Stop()
			}
			return
		case <-ticker.C:
			refresh(false)
		case <-c.cat.kick:
			refresh(true)
		case <-settleC:
			refresh(false)
		}
	}
}

// syncTriggers runs an informer on each trigger resource the catalog serves with list and
// watch, and stops the ones it no longer serves. Whether each is on is logged once per change.
func (c *Cluster) syncTriggers(ctx context.Context, cat *Catalog) {
	c.cat.mu.Lock()
	defer c.cat.mu.Unlock()
	for _, gvr := range triggerResources {
		served := cat.Serves(gvr)
		cancel, running := c.cat.triggers[gvr]
		switch {
		case served && !running:
			c.cat.triggers[gvr] = c.startTrigger(ctx, gvr)
			c.cat.watchOff[gvr] = false
			c.log.Info("watching for discovery changes", "resource", gvr.String())
		case !served && running:
			cancel()
			delete(c.cat.triggers, gvr)
		}
		c.opts.Metrics.setTrigger(c.name, gvr, served)
		if !served && !c.cat.watchOff[gvr] {
			c.cat.watchOff[gvr] = true
			c.log.Info("not watching for discovery changes: the cluster does not serve this resource with list and watch; the periodic discovery refresh picks up its changes, and starts the watch if the cluster serves it later",
				"resource", gvr.String())
		}
	}
}

// startTrigger runs an informer on gvr that asks for a refresh on every change. It keeps only
// the objects' names: a CRD's schema can be large and nothing here reads it.
func (c *Cluster) startTrigger(ctx context.Context, gvr schema.GroupVersionResource) context.CancelFunc {
	ctx, cancel := context.WithCancel(ctx)
	inf := dynamicinformer.NewFilteredDynamicInformer(c.client, gvr, "", 0, cache.Indexers{}, nil).Informer()
	_ = inf.SetTransform(func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		slim := &unstructured.Unstructured{Object: map[string]any{}}
		slim.SetAPIVersion(u.GetAPIVersion())
		slim.SetKind(u.GetKind())
		slim.SetName(u.GetName())
		slim.SetUID(u.GetUID())
		slim.SetResourceVersion(u.GetResourceVersion())
		return slim, nil
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(_ any, initial bool) {
			if !initial {
				c.RequestRefresh()
			}
		},
		UpdateFunc: func(_, _ any) { c.RequestRefresh() },
		DeleteFunc: func(any) { c.RequestRefresh() },
	})
	go inf.RunWithContext(ctx)
	return cancel
}

func (c *Cluster) stopTriggers() {
	c.cat.mu.Lock()
	defer c.cat.mu.Unlock()
	for gvr, cancel := range c.cat.triggers {
		cancel()
		delete(c.cat.triggers, gvr)
	}
}
