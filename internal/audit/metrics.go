package audit

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the audit endpoint's Prometheus metrics.
type Metrics struct {
	requests   *prometheus.CounterVec
	events     *prometheus.CounterVec
	duration   prometheus.Histogram
	handler    *prometheus.HistogramVec
	batchBytes prometheus.Histogram
	refused    *prometheus.CounterVec
}

// The status codes the audit endpoint answers with; pre-initialised in
// kubescribe_audit_requests_total.
var responseCodes = []int{200, 400, 401, 403, 404, 405, 413, 503}

// NewMetrics registers the audit endpoint's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_audit_requests_total",
			Help: "Audit webhook requests received, by HTTP status code of the answer.",
		}, []string{"code"}),
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_audit_events_total",
			Help: "Audit events in acknowledged batches, by result: kept (became a fact) or the reason it was dropped.",
		}, []string{"result"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubescribe_audit_request_duration_seconds",
			Help:    "Time to answer an audit webhook request, including storing its facts.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		handler: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubescribe_audit_handler_duration_seconds",
			Help:    "Time to answer a POST /audit/{route} from an authenticated caller with a valid route, by route: reading, decoding and storing the batch.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		batchBytes: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubescribe_audit_batch_bytes",
			Help:    "Size of the audit EventList bodies read (within the body limit).",
			Buckets: prometheus.ExponentialBuckets(1024, 4, 9), // 1 KiB .. 64 MiB
		}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_audit_refused_total",
			Help: "Audit requests refused before their body was read, by reason: unauthenticated (401) or route_not_bound (403: the credential may not post for that route).",
		}, []string{"reason"}),
	}
	for _, r := range []string{refusedUnauthenticated, refusedRouteNotBound} {
		m.refused.WithLabelValues(r)
	}
	for _, c := range responseCodes {
		m.requests.WithLabelValues(strconv.Itoa(c))
	}
	m.events.WithLabelValues(ResultKept)
	for _, r := range DropReasons {
		m.events.WithLabelValues(string(r))
	}
	return m
}

// Reasons of kubescribe_audit_refused_total.
const (
	refusedUnauthenticated = "unauthenticated"
	refusedRouteNotBound   = "route_not_bound"
)

func (m *Metrics) observeStats(s DecodeStats) {
	m.events.WithLabelValues(ResultKept).Add(float64(s.Kept))
	for r, n := range s.Dropped {
		m.events.WithLabelValues(string(r)).Add(float64(n))
	}
}

func (m *Metrics) observeHandler(route string, d time.Duration) {
	m.handler.WithLabelValues(route).Observe(d.Seconds())
}
