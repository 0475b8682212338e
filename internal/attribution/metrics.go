package attribution

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of the join.
type Metrics struct {
	joins        *prometheus.CounterVec
	wait         *prometheus.HistogramVec
	pending      prometheus.Gauge
	lookupErrors prometheus.Counter
	bySource     *prometheus.CounterVec
	ambiguous    prometheus.Counter
	overflows    prometheus.Counter
	reviewLost   prometheus.Counter
	factsRefused *prometheus.CounterVec
	resumeGauge  prometheus.Gauge
	resumeWaits  *prometheus.CounterVec
}

// NewMetrics registers the join's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		joins: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_attribution_joins_total",
			Help: "Changes attributed, by result: resolved (an audit fact named the author), unresolved (none within the grace window), snapshot (found by an initial list; nobody's change).",
		}, []string{"result"}),
		wait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubescribe_attribution_join_wait_seconds",
			Help:    "How long a change waited for its audit fact, by result.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30},
		}, []string{"result"}),
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_attribution_pending_changes",
			Help: "Changes waiting for their audit fact or for an earlier change of the same object.",
		}),
		lookupErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_attribution_lookup_errors_total",
			Help: "Fact lookups that failed (Redis unreachable or a corrupt fact).",
		}),
	}
	m.bySource = f.NewCounterVec(prometheus.CounterOpts{
		Name: "kubescribe_attribution_resolved_total",
		Help: "Changes whose author was named, by the tier that named it: audit (an audit fact) or admission (an admission candidate the watch confirmed).",
	}, []string{"source"})
	m.ambiguous = f.NewCounter(prometheus.CounterOpts{
		Name: "kubescribe_attribution_ambiguous_candidates_total",
		Help: "Changes left unresolved because admission candidates of different users matched them, or more candidates than the bound were recorded for their base version.",
	})
	m.overflows = f.NewCounter(prometheus.CounterOpts{
		Name: "kubescribe_attribution_candidate_overflows_total",
		Help: "Changes left unresolved because more admission candidates than the bound (64) were recorded for their object's base version (also counted in kubescribe_attribution_ambiguous_candidates_total).",
	})
	m.reviewLost = f.NewCounter(prometheus.CounterOpts{
		Name: "kubescribe_attribution_candidate_doubtful_total",
		Help: "Changes left unresolved although one user's admission candidates confirmed them, because a review of their cluster was lost (refused busy, over a bound, body too slow, dropped before or by Redis) shortly before: the real author's candidate may be the lost one.",
	})
	m.factsRefused = f.NewCounterVec(prometheus.CounterOpts{
		Name: "kubescribe_attribution_facts_refused_total",
		Help: "Audit facts refused as evidence (not stored) because their stage timestamp lies outside the apiserver's delivery window, by reason: stale (older than the arrival minus --audit-fact-max-delay and the skew), future (newer than the arrival plus --audit-fact-clock-skew).",
	}, []string{"reason"})
	m.resumeGauge = f.NewGauge(prometheus.GaugeOpts{
		Name: "kubescribe_attribution_resume_waiting_changes",
		Help: "Changes waiting past the grace window for an audit fact the apiserver may still be retrying (--attribution-resume-grace): changed while nothing watched, or live changes whose audit batch may have failed.",
	})
	m.resumeWaits = f.NewCounterVec(prometheus.CounterOpts{
		Name: "kubescribe_attribution_resume_waits_total",
		Help: "Changes that waited for an audit fact the apiserver may still be retrying, by reason (resumed: changed while nothing watched; replayed: an event a stream replayed when it resumed, which the replica that lost it may not have had the fact of; delivery: a live change whose audit batch may have failed) and outcome (resolved, unresolved, abandoned: left for the next start at shutdown).",
	}, []string{"reason", "outcome"})
	for _, r := range []string{resumeResumed, resumeReplayed, resumeDelivery} {
		for _, o := range []string{"resolved", "unresolved", "abandoned"} {
			m.resumeWaits.WithLabelValues(r, o)
		}
	}
	m.factsRefused.WithLabelValues(refusedStale)
	m.factsRefused.WithLabelValues(refusedFuture)
	for _, r := range []string{"resolved", "unresolved", "snapshot"} {
		m.joins.WithLabelValues(r)
	}
	for _, s := range []Source{SourceAudit, SourceAdmission} {
		m.bySource.WithLabelValues(string(s))
	}
	return m
}

func (m *Metrics) resolvedBy(s Source) {
	if m != nil {
		m.bySource.WithLabelValues(string(s)).Inc()
	}
}

func (m *Metrics) ambiguousInc(overflow bool) {
	if m == nil {
		return
	}
	m.ambiguous.Inc()
	if overflow {
		m.overflows.Inc()
	}
}

func (m *Metrics) reviewLostInc() {
	if m != nil {
		m.reviewLost.Inc()
	}
}

func (m *Metrics) observe(result string, waited time.Duration) {
	if m == nil {
		return
	}
	m.joins.WithLabelValues(result).Inc()
	m.wait.WithLabelValues(result).Observe(waited.Seconds())
}

func (m *Metrics) resumeWaiting(delta float64) {
	if m != nil {
		m.resumeGauge.Add(delta)
	}
}

func (m *Metrics) resumeWaitEnded(reason string, resolved, abandoned bool) {
	if m == nil {
		return
	}
	outcome := "unresolved"
	switch {
	case abandoned:
		outcome = "abandoned"
	case resolved:
		outcome = "resolved"
	}
	m.resumeWaits.WithLabelValues(reason, outcome).Inc()
}
