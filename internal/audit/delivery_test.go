package audit

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeliveriesDoubtful: a route is doubtful until its first batch is stored, and again for the
// changes observed up to DeliverySlack before a failed batch; other routes are not affected.
func TestDeliveriesDoubtful(t *testing.T) {
	d := NewDeliveries()
	t0 := time.Now()
	require.True(t, d.Doubtful("local", t0), "nothing delivered yet: the apiserver may not reach this process")

	d.Delivered("local", t0)
	require.True(t, d.Doubtful("local", t0.Add(-time.Minute)), "a change before the first delivery may be in a failed batch")
	require.False(t, d.Doubtful("local", t0.Add(DeliverySlack+time.Second)))

	d.Delivered("local", t0.Add(time.Hour)) // later deliveries move nothing
	require.False(t, d.Doubtful("local", t0.Add(DeliverySlack+time.Second)))

	d.Failed("local", t0.Add(2*time.Minute))
	require.True(t, d.Doubtful("local", t0.Add(2*time.Minute+DeliverySlack)), "observed within the slack after the failure")
	require.True(t, d.Doubtful("local", t0.Add(time.Minute)), "observed before the failure")
	require.False(t, d.Doubtful("local", t0.Add(2*time.Minute+DeliverySlack+time.Second)))
	require.True(t, d.Doubtful("remote", t0.Add(time.Hour)), "another route knows nothing of local's deliveries")

	var none *Deliveries
	none.Delivered("local", t0)
	require.False(t, none.Doubtful("local", t0), "no Deliveries: nothing is doubtful")
}

// TestHandlerReportsDeliveries: a stored batch makes its route delivered; a batch the store
// failed (answered 503, retried by the apiserver) makes it doubtful again.
func TestHandlerReportsDeliveries(t *testing.T) {
	d := NewDeliveries()
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
