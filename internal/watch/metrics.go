package watch

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Metrics of the watch side. One Metrics serves every cluster of a Registry.
type Metrics struct {
	events    *prometheus.CounterVec
	informers *prometheus.GaugeVec
	excludes  *prometheus.CounterVec
	refreshes *prometheus.CounterVec
	triggers  *prometheus.GaugeVec
	repacks   *prometheus.CounterVec
	refusals  *prometheus.CounterVec
	replays   *prometheus.CounterVec
	replayEvs *prometheus.CounterVec
	seals     *prometheus.CounterVec
}

// NewMetrics creates the watch metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_events_total",
			Help: "Objects delivered by the informers (initial lists and watch events), by cluster, resource and type (create, update, delete), before deduplication.",
		}, []string{"cluster", "resource", "type"}),
		informers: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubescribe_watch_informers",
			Help: "Running informers, by cluster: one per (resource, namespace scope), shared by every GitTarget that selects it.",
		}, []string{"cluster"}),
		excludes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_events_excluded_total",
			Help: "Writes a rule excludes from a GitTarget, not mirrored, by GitTarget, group, resource and reason (field_manager: excludeFieldManagers; user: excludeUsers).",
		}, []string{"gittarget_namespace", "gittarget_name", "group", "resource", "reason"}),
		refreshes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_discovery_refreshes_total",
			Help: "Reads of a cluster's discovery catalog after the first, by cluster and result: changed, unchanged or failed (the last catalog is kept).",
		}, []string{"cluster", "result"}),
		triggers: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubescribe_watch_discovery_triggers",
			Help: "1 while changes of the resource (customresourcedefinitions.apiextensions.k8s.io, apiservices.apiregistration.k8s.io) trigger a discovery refresh in the cluster, 0 while the cluster does not serve it with list and watch.",
		}, []string{"cluster", "resource"}),
		repacks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_manifest_repacks_total",
			Help: "Times an informer, idle after its objects changed, copied the declared forms it holds into fresh memory so that the superseded ones could be freed, by cluster and resource.",
		}, []string{"cluster", "resource"}),
		refusals: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_objects_refused_total",
			Help: "Objects a cluster's list or watch returned outside what the informer asked for, refused before they are kept, by cluster, resource and reason (namespace: another namespace than the watched one; group: an apiVersion of another API group). Only a non-conformant server sends them.",
		}, []string{"cluster", "resource", "reason"}),
		replays: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_replays_total",
			Help: "Streams that resumed on a branch whose previous writer may have died holding changes (a start, a takeover from a replica that left), by cluster, resource and result: replayed (the events since the previous owner's recorded position were replayed, so nothing it held unpushed is collapsed), expired (the apiserver no longer held them), failed (the watch failed, or too many events), no_trail (no position recorded: a first start, or a stream that saw no event).",
		}, []string{"cluster", "resource", "result"}),
		replayEvs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_replayed_events_total",
			Help: "Events resumed streams' replays read, by cluster, resource and kind: read (all), unpushed (those the cursor did not show pushed: versions a lost owner held, handed over again).",
		}, []string{"cluster", "resource", "kind"}),
		seals: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_watch_sealed_total",
			Help: "Declared forms encrypted for a GitTarget's recipients before they left the watch (Secrets), by cluster, resource and result: sealed, or failed (the change was not handed over; the log says why).",
		}, []string{"cluster", "resource", "result"}),
	}
}

func (m *Metrics) sealed(cluster string, gvr schema.GroupVersionResource, err error) {
	if m != nil {
		result := "sealed"
		if err != nil {
			result = "failed"
		}
		m.seals.WithLabelValues(cluster, resourceLabel(gvr), result).Inc()
	}
}

func (m *Metrics) replayed(cluster string, gvr schema.GroupVersionResource, result string, read, unpushed int) {
	if m != nil {
		m.replays.WithLabelValues(cluster, resourceLabel(gvr), result).Inc()
		m.replayEvs.WithLabelValues(cluster, resourceLabel(gvr), "read").Add(float64(read))
		m.replayEvs.WithLabelValues(cluster, resourceLabel(gvr), "unpushed").Add(float64(unpushed))
	}
}

func (m *Metrics) refused(cluster string, gvr schema.GroupVersionResource, reason string) {
	if m != nil {
		m.refusals.WithLabelValues(cluster, resourceLabel(gvr), reason).Inc()
	}
}

func (m *Metrics) repacked(cluster string, gvr schema.GroupVersionResource) {
	if m != nil {
		m.repacks.WithLabelValues(cluster, resourceLabel(gvr)).Inc()
	}
}

// Results of a discovery refresh.
const (
	refreshChanged   = "changed"
	refreshUnchanged = "unchanged"
	refreshFailed    = "failed"
)

func (m *Metrics) refreshed(cluster, result string) {
	if m != nil {
		m.refreshes.WithLabelValues(cluster, result).Inc()
	}
}

func (m *Metrics) setTrigger(cluster string, gvr schema.GroupVersionResource, on bool) {
	if m != nil {
		v := 0.0
		if on {
			v = 1
		}
		m.triggers.WithLabelValues(cluster, resourceLabel(gvr)).Set(v)
	}
}

// The reasons of kubescribe_watch_events_excluded_total.
const (
	ReasonFieldManager = "field_manager"
	ReasonUser         = "user"
)

// Excluded counts a write not mirrored to target because a rule excludes its field manager
// or its user. The join reports user exclusions through it.
func (m *Metrics) Excluded(target types.NamespacedName, gvr schema.GroupVersionResource, reason string) {
	if m != nil {
		m.excludes.WithLabelValues(target.Namespace, target.Name, gvr.Group, gvr.Resource, reason).Inc()
	}
}

func (m *Metrics) observed(cluster string, gvr schema.GroupVersionResource, op Op) {
	if m != nil {
		m.events.WithLabelValues(cluster, resourceLabel(gvr), string(op)).Inc()
	}
}

func (m *Metrics) setInformers(cluster string, n int) {
	if m != nil {
		m.informers.WithLabelValues(cluster).Set(float64(n))
	}
}

// resourceLabel is "<resource>.<group>" ("configmaps" for the core group).
func resourceLabel(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Resource
	}
	return gvr.Resource + "." + gvr.Group
}
