package ownership

import "github.com/prometheus/client_golang/prometheus"

// metrics are the Membership's own; the controller counts the branches it gains and loses
// (Handovers).
type metrics struct {
	members       prometheus.Gauge
	leader        prometheus.Gauge
	viewChanges   prometheus.Counter
	renewFailures prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_ownership_members",
			Help: "Replicas this replica sees live, itself included while its member Lease is renewed in time.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_ownership_leader",
			Help: "1 while this replica holds the leader Lease and runs the cluster-wide singletons.",
		}),
		viewChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_ownership_view_changes_total",
			Help: "Changes of the set of live replicas this replica saw (each moves some branches).",
		}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_ownership_lease_renew_failures_total",
			Help: "Failed writes of this replica's member Lease.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.members, m.leader, m.viewChanges, m.renewFailures)
	}
	return m
}

// Handovers counts the branches a replica comes to write and stops writing, and how long a
// branch it took over had no writer.
type Handovers struct {
	acquired, released prometheus.Counter
	gap                prometheus.Histogram
	owned              prometheus.Gauge
}

// NewHandovers registers the handover metrics with reg (nil: not registered).
func NewHandovers(reg prometheus.Registerer) *Handovers {
	h := &Handovers{
		acquired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_ownership_branches_acquired_total",
			Help: "Branches this replica came to write (it joined, or their owner left).",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_ownership_branches_released_total",
			Help: "Branches this replica stopped writing because another replica owns them now.",
		}),
		gap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubescribe_ownership_takeover_gap_seconds",
			Help:    "For a branch taken over from a replica that left, the seconds from when that replica was last known alive to the takeover: how long the branch had no writer.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120},
		}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_ownership_branches",
			Help: "Branches (repository and branch of a GitTarget) this replica owns and writes.",
		}),
	}
	if reg != nil {
		reg.MustRegister(h.acquired, h.released, h.gap, h.owned)
	}
	return h
}

// Acquired counts a branch this replica came to write; gap, when known, is how long it had no
// writer (Membership.TakeoverGap).
func (h *Handovers) Acquired(gap float64, known bool) {
	if h == nil {
		return
	}
	h.acquired.Inc()
	if known {
		h.gap.Observe(gap)
	}
}

// Released counts a branch this replica stopped writing.
func (h *Handovers) Released() {
	if h != nil {
		h.released.Inc()
	}
}

// Owned sets how many branches this replica writes.
func (h *Handovers) Owned(n int) {
	if h != nil {
		h.owned.Set(float64(n))
	}
}
