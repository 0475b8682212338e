package git

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Push results, the values of kubescribe_git_push_total's "result" label.
const (
	pushResultSuccess  = "success"
	pushResultRejected = "rejected" // the remote moved (or was rewound): pending commits are rebuilt
	pushResultError    = "error"
)

// Kinds of working-store compaction, the values of kubescribe_git_store_compactions_total's
// "kind" label.
const (
	compactionPrune = "prune" // superseded trees, blobs and old commits deleted in place
	compactionFull  = "full"  // the tip's trees copied into a new store
)

// Results of a branch check (Worker.checkBranch), the values of
// kubescribe_git_branch_checks_total's "result" label.
const (
	branchCheckUnchanged = "unchanged"
	branchCheckMoved     = "moved" // someone else's commits, a rewind or a deletion
	branchCheckError     = "error"
)

// Metrics of the git workers. One Metrics may be shared by all workers of a process; values are
// summed over them.
type Metrics struct {
	commits      prometheus.Counter
	pushes       *prometheus.CounterVec
	pushDuration prometheus.Histogram
	pending      prometheus.Gauge
	dropped      prometheus.Counter
	unrouted     prometheus.Counter
	invalid      prometheus.Counter
	pushBytesTot prometheus.Counter
	unpushed     prometheus.Gauge
	storeObjects prometheus.Gauge
	compactions  *prometheus.CounterVec
	folderChecks *prometheus.CounterVec
	folderFetch  *prometheus.CounterVec
	startOvers   prometheus.Counter
	branchChecks *prometheus.CounterVec
	supersedes   prometheus.Counter
	epochsForged prometheus.Counter
	released     prometheus.Counter
	duplicates   prometheus.Counter
}

// NewMetrics creates the git metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		commits: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_commits_total",
			Help: "Commits created by the git workers (rebuilding a commit on a new remote tip does not count again).",
		}),
		pushes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_git_push_total",
			Help: "Push attempts by result: success, rejected (the remote moved; rebuilt and retried) or error.",
		}, []string{"result"}),
		pushDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubescribe_git_push_duration_seconds",
			Help:    "Duration of push attempts, whatever their result.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 11),
		}),
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_git_pending_changes",
			Help: "Changes submitted to the git workers and not yet pushed.",
		}),
		dropped: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_dropped_changes_total",
			Help: "Changes submitted to a git worker after its shutdown began; they are never committed.",
		}),
		unrouted: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_unrouted_changes_total",
			Help: "Changes dropped because their GitTarget had no destination (not Ready) when they arrived, or had moved to another one (retarget).",
		}),
		invalid: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_invalid_changes_total",
			Help: "Changes refused by the git workers because their path cannot be stored: a namespace, group, resource or name that is empty, '.' or '..', holds '/', '\\' or a NUL, starts with '.git', or would land outside the GitTarget's folder. Each is logged.",
		}),
		pushBytesTot: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_push_bytes_total",
			Help: "Bytes of the packs sent by push attempts, whatever their result.",
		}),
		unpushed: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_git_unpushed_commits",
			Help: "Commits (and closed commit windows) of running git workers not on the remote yet.",
		}),
		storeObjects: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_git_store_objects",
			Help: "Objects held in the in-memory working stores of running git workers.",
		}),
		compactions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_git_store_compactions_total",
			Help: "Compactions of the git workers' working stores, by kind: prune (what commits superseded deleted in place) or full (the tip's trees copied into a new store).",
		}, []string{"kind"}),
		folderChecks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_git_folder_checks_total",
			Help: "Checks of a GitTarget's folder before the first commit into it, by result: adoptable, refused, known (absent, or as kubescribe last pushed it: not scanned) or error.",
		}, []string{"result"}),
		folderFetch: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_git_folder_check_fetches_total",
			Help: "Fetches made to read a folder's files for its check, by kind: blobs (the folder's files by id) or full (the branch tip with every file, when the remote refused the ids).",
		}, []string{"kind"}),
		branchChecks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_git_branch_checks_total",
			Help: "Fetches of a branch a git worker had nothing to push to (GitProvider spec.fetchInterval), by result: unchanged, moved (someone else's commits, a rewind or a deletion) or error.",
		}, []string{"result"}),
		supersedes: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_writer_superseded_total",
			Help: "Git workers that gave their branch up because a commit of a newer writer epoch (another replica that took the branch over) was on it; what they held unpushed is written by the newer writer.",
		}),
		epochsForged: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_writer_epochs_ignored_total",
			Help: "Writer epochs claimed by a commit on a branch, above the worker's, that supersede nothing: never handed out by the Redis counter (pushed by someone with push access), or not checkable (Redis did not answer).",
		}),
		duplicates: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_replayed_duplicates_total",
			Help: "Changes not committed because the branch already held their version, or a newer one, from commits another writer of the slot made: another replica writing at once, or a writer lost before its resume cursors advanced.",
		}),
		released: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_released_changes_total",
			Help: "Changes of GitTargets whose branch another replica writes now, dropped during a handover: the owner's streams hand them over from the resume cursors.",
		}),
		startOvers: f.NewCounter(prometheus.CounterOpts{
			Name: "kubescribe_git_branch_start_overs_total",
			Help: "Branches a git worker started over from nothing because the server refused them back on their old history (deleted, then garbage-collected); every file is written again from the cluster.",
		}),
	}
	for _, r := range []string{pushResultSuccess, pushResultRejected, pushResultError} {
		m.pushes.WithLabelValues(r)
	}
	for _, r := range []string{folderCheckAdoptable, folderCheckRefused, folderCheckKnown, folderCheckError} {
		m.folderChecks.WithLabelValues(r)
	}
	for _, k := range []string{folderFetchBlobs, folderFetchFull} {
		m.folderFetch.WithLabelValues(k)
	}
	for _, k := range []string{compactionPrune, compactionFull} {
		m.compactions.WithLabelValues(k)
	}
	for _, r := range []string{branchCheckUnchanged, branchCheckMoved, branchCheckError} {
		m.branchChecks.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) commitCreated() {
	if m != nil {
		m.commits.Inc()
	}
}

func (m *Metrics) pushed(result string, d time.Duration) {
	if m != nil {
		m.pushes.WithLabelValues(result).Inc()
		m.pushDuration.Observe(d.Seconds())
	}
}

func (m *Metrics) addPending(n int) {
	if m != nil && n != 0 {
		m.pending.Add(float64(n))
	}
}

func (m *Metrics) superseded() {
	if m != nil {
		m.supersedes.Inc()
	}
}

func (m *Metrics) epochIgnored() {
	if m != nil {
		m.epochsForged.Inc()
	}
}

func (m *Metrics) replayDuplicates(n int) {
	if m != nil {
		m.duplicates.Add(float64(n))
	}
}

func (m *Metrics) changeReleased() {
	if m != nil {
		m.released.Inc()
	}
}

func (m *Metrics) changeDropped() {
	if m != nil {
		m.dropped.Inc()
	}
}

func (m *Metrics) changeInvalid() {
	if m != nil {
		m.invalid.Inc()
	}
}

func (m *Metrics) changeUnrouted() {
	if m != nil {
		m.unrouted.Inc()
	}
}

func (m *Metrics) pushBytes(n int) {
	if m != nil {
		m.pushBytesTot.Add(float64(n))
	}
}

func (m *Metrics) addUnpushed(n int) {
	if m != nil && n != 0 {
		m.unpushed.Add(float64(n))
	}
}

func (m *Metrics) addStoreObjects(n int) {
	if m != nil && n != 0 {
		m.storeObjects.Add(float64(n))
	}
}

func (m *Metrics) storeCompacted(kind string) {
	if m != nil {
		m.compactions.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) folderChecked(result string) {
	if m != nil {
		m.folderChecks.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) folderFetched(kind string) {
	if m != nil {
		m.folderFetch.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) branchStartedOver() {
	if m != nil {
		m.startOvers.Inc()
	}
}

func (m *Metrics) branchChecked(result string) {
	if m != nil {
		m.branchChecks.WithLabelValues(result).Inc()
	}
}
