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
	mu   sync.Mutex
	last map[string]time.Time
	err  error
}

func (h *history) RecordDelivery(_ context.Context, route string, t time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		h.last = map[string]time.Time{}
	}
	h.last[route] = t
	return nil
}

func (h *history) DeliveredSince(_ context.Context, route string, since time.Time) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.last[route]
	return ok && !t.Before(since), h.err
}

func (h *history) recorded(route string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.last[route]
	return ok
}

// TestDeliveriesDoubtful: a route that delivered recently is doubtful until its first batch is
// stored by this process, and again for the changes observed up to DeliverySlack before a
// failed batch; a route that never delivered is not doubtful (nothing is on its way), unless one
// of its batches failed; other routes are not affected.
func TestDeliveriesDoubtful(t *testing.T) {
	h := &history{}
	d := NewDeliveries(h)
	t0 := time.Now()
	require.False(t, d.Doubtful("local", t0), "a route that never delivered: nothing to wait for")
	require.NoError(t, h.RecordDelivery(context.Background(), "local", t0.Add(-time.Hour)))
	require.True(t, d.Doubtful("local", t0), "it delivered to a process before: the apiserver may not reach this one yet")

	d.Delivered("local", t0)
	require.True(t, d.Doubtful("local", t0.Add(-time.Minute)), "a change before the first delivery may be in a failed batch")
	require.False(t, d.Doubtful("local", t0.Add(DeliverySlack+time.Second)))
	require.Eventually(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.last["local"].Equal(t0) }, 5*time.Second, time.Millisecond,
		"the delivery is recorded in the history")

	d.Delivered("local", t0.Add(time.Hour)) // later deliveries move nothing
	require.False(t, d.Doubtful("local", t0.Add(DeliverySlack+time.Second)))

	d.Failed("local", t0.Add(2*time.Minute))
	require.True(t, d.Doubtful("local", t0.Add(2*time.Minute+DeliverySlack)), "observed within the slack after the failure")
	require.True(t, d.Doubtful("local", t0.Add(time.Minute)), "observed before the failure")
	require.False(t, d.Doubtful("local", t0.Add(2*time.Minute+DeliverySlack+time.Second)))

	require.False(t, d.Doubtful("remote", t0), "another route knows nothing of local's deliveries")
	d.Failed("remote", t0)
	require.True(t, d.Doubtful("remote", t0), "a route whose batch failed is doubtful, delivered before or not")

	h.err = errors.New("redis down")
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
	require.False(t, d.Doubtful("local", time.Now().Add(DeliverySlack+time.Second)))

	observed := time.Now()
	require.False(t, d.Doubtful("local", observed.Add(DeliverySlack+time.Second)))
	th.store.mu.Lock()
	th.store.err = errors.New("redis down")
	th.store.mu.Unlock()
	require.Equal(t, http.StatusServiceUnavailable, post())
	require.True(t, d.Doubtful("local", observed), "the change's batch may be the one the apiserver retries")
}
