package audit

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// history is an in-memory RouteHistory.
type history struct {
	mu     sync.Mutex
	last   map[string]time.Time
	failed map[string]time.Time
	err    error
}

func (h *history) set(m *map[string]time.Time, route string, t time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if *m == nil {
		*m = map[string]time.Time{}
	}
	(*m)[route] = t
	return nil
}

func (h *history) get(m map[string]time.Time, route string) (time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return m[route], h.err
}

func (h *history) RecordDelivery(_ context.Context, route string, t time.Time) error {
	return h.set(&h.last, route, t)
}

func (h *history) LastDelivery(_ context.Context, route string) (time.Time, error) {
	return h.get(h.last, route)
}

func (h *history) RecordFailure(_ context.Context, route string, t time.Time) error {
	return h.set(&h.failed, route, t)
}

func (h *history) LastFailure(_ context.Context, route string) (time.Time, error) {
	return h.get(h.failed, route)
}

// TestDeliveriesDoubtful: a change is doubtful when its route delivered nothing, to any
// replica, since the change (the apiserver cannot reach kubescribe, or hangs on a replica), or
// when a batch of the route failed at most DeliverySlack before it, in this process or another;
// a route that never delivered lately is not doubtful (nothing is on its way); other routes are
// not affected.
func TestDeliveriesDoubtful(t *testing.T) {
	h := &history{}
	d := NewDeliveries(h)
	t0 := time.Now()
	require.False(t, d.Doubtful("local", t0), "a route that never delivered: nothing to wait for")
	require.NoError(t, h.RecordDelivery(context.Background(), "local", t0.Add(-2*RouteHistoryWindow)))
	require.False(t, d.Doubtful("local", t0), "nor one that delivered only long ago")
	require.NoError(t, h.RecordDelivery(context.Background(), "local", t0.Add(-time.Hour)))
	require.True(t, d.Doubtful("local", t0), "it delivered before, nothing since the change: its batch may be failing")

	// Another replica stores a batch: recorded in the shared history, every replica's changes
	// before it have had their chance.
	other := NewDeliveries(h)
	other.Delivered("local", t0.Add(time.Second))
	require.Eventually(t, func() bool { return !d.Doubtful("local", t0) }, 5*time.Second, time.Millisecond,
		"a delivery after the change, to another replica, is recorded and seen")
	require.True(t, d.Doubtful("local", t0.Add(2*time.Second)), "nothing delivered since this one")

	// Deliveries in a burst are written at most once a second, the newest always.
	for i := range 50 {
		other.Delivered("local", t0.Add(3*time.Second+time.Duration(i)*time.Millisecond))
	}
	require.Eventually(t, func() bool {
		last, _ := h.LastDelivery(context.Background(), "local")
		return last.Equal(t0.Add(3*time.Second + 49*time.Millisecond))
	}, 5*time.Second, time.Millisecond)

	d.Failed("local", t0.Add(2*time.Minute))
	require.True(t, d.Doubtful("local", t0.Add(time.Second)), "observed before the failure")
	require.True(t, d.Doubtful("local", t0.Add(2*time.Minute+DeliverySlack)), "observed within the slack after the failure")
	require.Eventually(t, func() bool { return other.Doubtful("local", t0.Add(time.Second)) }, 5*time.Second, time.Millisecond,
		"the failure is shared with the other replicas")

	require.False(t, d.Doubtful("remote", t0), "another route knows nothing of local's deliveries")
	d.Failed("remote", t0)
	require.True(t, d.Doubtful("remote", t0), "a route whose batch failed is doubtful, delivered before or not")

	h.mu.Lock()
	h.err = errors.New("redis down")
	h.mu.Unlock()
	require.True(t, d.Doubtful("tenant", t0), "a history that cannot be read is doubtful")

	var none *Deliveries
	none.Delivered("local", t0)
	require.False(t, none.Doubtful("local", t0), "no Deliveries: nothing is doubtful")
}

// TestHandlerReportsDeliveries: a stored batch makes its route delivered; a batch the store
// failed (answered 503, retried by the apiserver) makes it doubtful again.
func TestHandlerReportsDeliveries(t *testing.T) {
	d := NewDeliveries(nil)
	th := newTestHandler(t, func(o *HandlerOptions) { o.Deliveries = d })
	post := func() int {
		req := httptest.NewRequest(http.MethodPost, "/audit/local", bytes.NewReader(fixture(t, "testdata/update.json")))
		req.Header.Set("Authorization", "Bearer "+goodToken)
		rec := httptest.NewRecorder()
		th.ServeHTTP(rec, req)
		return rec.Code
	}
	require.Equal(t, http.StatusOK, post())
	observed := time.Now()
	require.False(t, d.Doubtful("local", observed.Add(DeliverySlack+time.Second)), "without a history only failures count")
	th.store.mu.Lock()
	th.store.err = errors.New("redis down")
	th.store.mu.Unlock()
	require.Equal(t, http.StatusServiceUnavailable, post())
	require.True(t, d.Doubtful("local", observed), "the change's batch may be the one the apiserver retries")
}
