package audit

import (
	"context"
	"slices"
	"sync"
	"time"
)

// DeliverySlack is how far before a change's observation a failed delivery still counts as
// one that may have carried the change's fact: the audit event precedes the watch event, which
// lags behind the write by milliseconds, by a second or so under heavy load.
const DeliverySlack = 2 * time.Second

// RouteHistoryWindow is how recently a route must have delivered a batch (to any replica) to be
// expected to deliver again: one that never did (an apiserver whose audit webhook does not point
// at kubescribe) is not doubtful, or every unexplained change of it would wait for nothing.
const RouteHistoryWindow = 24 * time.Hour

// RouteHistory keeps, across replicas and restarts, when each route last delivered a batch and
// when a batch of it last failed; internal/attribution's Store implements it in Redis. Times
// that were never recorded are zero.
type RouteHistory interface {
	RecordDelivery(ctx context.Context, route string, t time.Time) error
	LastDelivery(ctx context.Context, route string) (time.Time, error)
	RecordFailure(ctx context.Context, route string, t time.Time) error
	LastFailure(ctx context.Context, route string) (time.Time, error)
}

// recordEvery is how often a process writes a route's newest delivery to the history: at most
// once a second, the newest one always written (a trailing write).
const recordEvery = time.Second

// historyTimeout bounds one call to the history.
const historyTimeout = 2 * time.Second

// Deliveries tells when the apiserver's audit deliveries of a route may be failing. The
// apiserver's audit webhook retries a batch it could not deliver (any error, k8s.io/apiserver
// plugin/pkg/audit/webhook) for up to about two minutes with its default settings, so the fact
// of a change whose batch failed can still arrive long after the change. Doubtful tells the
// join which changes to wait for that long.
//
// Every replica stores the batches the apiserver happens to send it (its connection goes to one
// replica at a time), and records them in the shared history; any replica's changes are judged
// by it. A change is doubtful when the route delivered nothing, to any replica, since it was
// observed (the apiserver cannot reach kubescribe, or its connection hangs on a replica that
// stopped answering), or when a batch of the route failed (answered 503) at most DeliverySlack
// before it. Routes are only those an authenticated caller may post for, so the maps stay small.
type Deliveries struct {
	history RouteHistory
	now     func() time.Time

	mu     sync.Mutex
	routes map[string]*deliveryState
}

type deliveryState struct {
	doubt     time.Time // the latest moment a delivery to this process may have failed
	newest    time.Time // the newest delivery to this process
	recorded  time.Time // the newest delivery written to the history
	writing   bool      // a write of newest is scheduled
	lastWrite time.Time // when the history was last written
}

// NewDeliveries returns a Deliveries that knows of no route yet. history may be nil: then only
// this process's failed batches make a change doubtful.
func NewDeliveries(history RouteHistory) *Deliveries {
	return &Deliveries{history: history, now: time.Now, routes: map[string]*deliveryState{}}
}

func (d *Deliveries) state(route string) *deliveryState {
	st := d.routes[route]
	if st == nil {
		st = &deliveryState{}
		d.routes[route] = st
	}
	return st
}

// Delivered records that a batch of route was stored at t, in the history within recordEvery.
func (d *Deliveries) Delivered(route string, t time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.state(route)
	if t.After(st.newest) {
		st.newest = t
	}
	if d.history == nil || st.writing || !st.newest.After(st.recorded) {
		return
	}
	st.writing = true
	wait := recordEvery - d.now().Sub(st.lastWrite)
	time.AfterFunc(max(0, wait), func() { d.record(route) }) // off the handler's path
}

// record writes route's newest delivery to the history, and schedules the next write if a
// newer one came meanwhile.
func (d *Deliveries) record(route string) {
	d.mu.Lock()
	st := d.state(route)
	t := st.newest
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
	_ = d.history.RecordDelivery(ctx, route, t) // best effort: a missed write makes changes wait longer, no more
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	st.recorded, st.lastWrite, st.writing = t, d.now(), false
	if st.newest.After(st.recorded) {
		st.writing = true
		time.AfterFunc(recordEvery, func() { d.record(route) })
	}
}

// Failed records that a batch of route could not be stored at t: the apiserver retries it.
func (d *Deliveries) Failed(route string, t time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	if st := d.state(route); t.After(st.doubt) {
		st.doubt = t
	}
	d.mu.Unlock()
	if d.history != nil {
		go func() { // best effort: the failure is often Redis', whose write fails too
			ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
			defer cancel()
			_ = d.history.RecordFailure(ctx, route, t)
		}()
	}
}

// Draining records that this process stops answering at until (a shutdown: its listener
// closes then): a batch the apiserver sends it up to then may fail and be retried, so every
// route it knows counts as failing until then, here and, through the history, in the other
// replicas. local names routes to mark besides those that delivered here.
func (d *Deliveries) Draining(until time.Time, local ...string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	routes := slices.Clone(local)
	for r := range d.routes {
		routes = append(routes, r)
	}
	d.mu.Unlock()
	slices.Sort(routes)
	for _, r := range slices.Compact(routes) {
		d.Failed(r, until)
	}
}

// Doubtful reports whether the batch holding the fact of a change of route observed at observed
// may have failed, so that the apiserver may still be retrying it: a batch of the route failed
// (in this process or, as recorded, another) at or after DeliverySlack before the change, or the
// route delivered recently but nothing since the change. A history that cannot be read counts
// as doubtful.
func (d *Deliveries) Doubtful(route string, observed time.Time) bool {
	if d == nil {
		return false
	}
	since := observed.Add(-DeliverySlack)
	d.mu.Lock()
	st := d.routes[route]
	local := st != nil && !st.doubt.Before(since)
	d.mu.Unlock()
	if local {
		return true
	}
	if d.history == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
	defer cancel()
	failed, err := d.history.LastFailure(ctx, route)
	if err != nil || !failed.Before(since) {
		return true
	}
	last, err := d.history.LastDelivery(ctx, route)
	switch {
	case err != nil:
		return true
	case last.IsZero() || last.Before(d.now().Add(-RouteHistoryWindow)):
		return false // never delivered (lately): nothing is on its way
	default:
		return last.Before(observed)
	}
}
