package audit

import (
	"context"
	"sync"
	"time"
)

// DeliverySlack is how far before a change's observation a failed delivery still counts as
// one that may have carried the change's fact: the audit event precedes the watch event, which
// lags behind the write by milliseconds, by a second or so under heavy load.
const DeliverySlack = 2 * time.Second

// RouteHistoryWindow is how recently a route must have delivered a batch (to any process
// sharing the history) to be expected to deliver again: a route that did is doubtful until this
// process stores its first batch; one that never did (an apiserver whose audit webhook does not
// point at kubescribe) is not, or every unexplained change of it would wait for nothing.
const RouteHistoryWindow = 24 * time.Hour

// RouteHistory keeps, across processes and restarts, when each route last delivered a batch;
// internal/attribution's Store implements it in Redis.
type RouteHistory interface {
	RecordDelivery(ctx context.Context, route string, t time.Time) error
	DeliveredSince(ctx context.Context, route string, since time.Time) (bool, error)
}

// historyInterval is how often a process records a route's deliveries in the history.
const historyInterval = 30 * time.Second

// historyTimeout bounds one call to the history.
const historyTimeout = 2 * time.Second

// Deliveries remembers, per route, when the apiserver's audit deliveries to this process may
// have failed. The apiserver's audit webhook retries a batch it could not deliver (any error,
// k8s.io/apiserver plugin/pkg/audit/webhook) for up to about two minutes with its default
// settings, so the fact of a change whose batch failed can still arrive long after the change.
// Doubtful tells the join which changes to wait for that long.
//
// A route that delivered recently (RouteHistory) counts as failing until its first batch is
// stored by this process (before that, the apiserver may not have reached it: a restart, a
// Service without ready endpoints), and every route again whenever storing one of its batches
// fails (the handler answers 503). Routes are only those an authenticated caller may post for,
// so the map stays small.
type Deliveries struct {
	history RouteHistory
	now     func() time.Time

	mu     sync.Mutex
	routes map[string]*deliveryState
}

type deliveryState struct {
	reached  bool      // a batch of the route was stored by this process
	doubt    time.Time // the latest moment a delivery may have failed
	recorded time.Time // when this process last recorded a delivery in the history
}

// NewDeliveries returns a Deliveries that knows of no route yet. history may be nil: then a
// route this process has not reached yet is never doubtful.
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

// Delivered records that a batch of route was stored at t.
func (d *Deliveries) Delivered(route string, t time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	st := d.state(route)
	if !st.reached {
		// Until now, the apiserver may have been failing to reach this process.
		st.reached = true
		if t.After(st.doubt) {
			st.doubt = t
		}
	}
	record := d.history != nil && t.Sub(st.recorded) >= historyInterval
	if record {
		st.recorded = t
	}
	d.mu.Unlock()
	if record {
		go func() { // best effort, off the handler's path
			ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
			defer cancel()
			_ = d.history.RecordDelivery(ctx, route, t)
		}()
	}
}

// Failed records that a batch of route could not be stored at t: the apiserver retries it.
func (d *Deliveries) Failed(route string, t time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.state(route); t.After(st.doubt) {
		st.doubt = t
	}
}

// Doubtful reports whether the batch holding the fact of a change of route observed at
// observed may have failed, so that the apiserver may still be retrying it: the route delivered
// recently but not yet to this process, or its first batch was stored, or one failed, at or
// after DeliverySlack before the change. A history that cannot be read counts as doubtful.
func (d *Deliveries) Doubtful(route string, observed time.Time) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	st := d.routes[route]
	reached := st != nil && st.reached
	doubt := !reached && st != nil && !st.doubt.Before(observed.Add(-DeliverySlack))
	if reached {
		doubt = !st.doubt.Before(observed.Add(-DeliverySlack))
	}
	d.mu.Unlock()
	if reached || doubt || d.history == nil {
		return doubt
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyTimeout)
	defer cancel()
	recent, err := d.history.DeliveredSince(ctx, route, d.now().Add(-RouteHistoryWindow))
	return err != nil || recent
}
