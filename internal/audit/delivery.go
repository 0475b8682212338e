package audit

import (
	"sync"
	"time"
)

// DeliverySlack is how far before a change's observation a failed delivery still counts as
// one that may have carried the change's fact: the audit event precedes the watch event, which
// may lag behind the write by a few seconds under load.
const DeliverySlack = 5 * time.Second

// Deliveries remembers, per route, when the apiserver's audit deliveries to this process may
// have failed. The apiserver's audit webhook retries a batch it could not deliver (any error,
// k8s.io/apiserver plugin/pkg/audit/webhook) for up to about two minutes with its default
// settings, so the fact of a change whose batch failed can still arrive long after the change.
// Doubtful tells the join which changes to wait for that long.
//
// A route counts as failing until its first batch is stored by this process (before that, the
// apiserver may not have reached it: a restart, a Service without ready endpoints), and again
// whenever storing a batch fails (the handler answers 503). Routes are only those an
// authenticated caller may post for, so the map stays small.
type Deliveries struct {
	mu     sync.Mutex
	routes map[string]*deliveryState
}

type deliveryState struct {
	reached bool      // a batch of the route was stored by this process
	doubt   time.Time // the latest moment a delivery may have failed
}

// NewDeliveries returns a Deliveries that knows of no route yet.
func NewDeliveries() *Deliveries {
	return &Deliveries{routes: map[string]*deliveryState{}}
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
	defer d.mu.Unlock()
	st := d.state(route)
	if !st.reached {
		// Until now, the apiserver may have been failing to reach this process.
		st.reached = true
		if t.After(st.doubt) {
			st.doubt = t
		}
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
// observed may have failed, so that the apiserver may still be retrying it: no batch of the
// route has been stored yet, or the first one was, or one failed, at or after DeliverySlack
// before the change.
func (d *Deliveries) Doubtful(route string, observed time.Time) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.routes[route]
	if st == nil || !st.reached {
		return true
	}
	return !st.doubt.Before(observed.Add(-DeliverySlack))
}
