package admission

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// PathPrefix is where the webhook is served: POST PathPrefix + "{route}".
const PathPrefix = "/validate/attribution/"

// Defaults of HandlerOptions.
const (
	// DefaultMaxBodyBytes: the apiserver accepts a request body of up to 3 MiB, and an UPDATE
	// review carries the new object and the old one (stored objects are at most 1.5 MiB, etcd's
	// default request limit), JSON-encoded, with the request's userInfo: 8 MiB leaves room for
	// every review of an object the apiserver accepts.
	DefaultMaxBodyBytes int64 = 8 << 20
	// DefaultInFlightBytes is how many bytes of review bodies are read and decoded at once,
	// over all requests (four reviews of the largest size, or thousands of ordinary ones).
	// Decoding costs a few times a body's size in heap; docs/managed-clusters.md says how
	// much.
	DefaultInFlightBytes int64 = 32 << 20
	// DefaultBodyWait is how long a review waits for its share of the in-flight budget before
	// it is refused with 429 and Retry-After (the apiserver's client retries it).
	DefaultBodyWait = 250 * time.Millisecond
	// DefaultBodyGrace and DefaultBodyMinRate bound how long a review may take to send its body
	// once it holds its share of the budget: the grace plus its share at the rate (an 8 MiB
	// review 3s, a small one 1s). The apiserver sends a body at once and gives the whole call
	// 2s (kubescribe's configurations; 30s at most); a caller trickling its body to keep its
	// share (issue 36, finding 1) is cut off then (408).
	DefaultBodyGrace         = time.Second
	DefaultBodyMinRate int64 = 4 << 20
	// DefaultQueueSize is how many candidates may wait to be recorded; past it they are
	// dropped (and counted), never waited for.
	DefaultQueueSize = 4096
	// DefaultQueueBytes bounds the queued candidates by their size (user, identifiers and
	// digest; the objects are never queued).
	DefaultQueueBytes int64 = 8 << 20
	// DefaultBatchSize is the most candidates written to Redis in one round trip.
	DefaultBatchSize = 256
	// DefaultStoreTimeout bounds one batch write.
	DefaultStoreTimeout = 2 * time.Second
)

// CandidateStore keeps candidates; attribution.Store implements it.
type CandidateStore interface {
	StoreCandidates(ctx context.Context, cs []Candidate) error
}

// Render turns an object into its declared-form manifest (declared.Manifest): the watch side
// renders with the same function, so equal objects give equal digests.
type Render func(*unstructured.Unstructured) ([]byte, error)

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Store records candidates. Required.
	Store CandidateStore
	// Render is the declared form. Required.
	Render Render
	// SecretDigest, when set, is the keyed digest a Secret's create or update is recorded
	// with (the watch gives the change the same one); without it no candidate is kept of them.
	SecretDigest func(plain []byte) [32]byte
	// MaxBodyBytes limits a review; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// InFlightBytes bounds the bodies being read and decoded at once (at least MaxBodyBytes);
	// CallerInFlightBytes bounds those of one credential (at least MaxBodyBytes; 0 means half
	// of InFlightBytes, at least MaxBodyBytes); BodyWait is how long a review may wait for its
	// share. 0 means the defaults.
	InFlightBytes       int64
	CallerInFlightBytes int64
	BodyWait            time.Duration
	// BodyGrace and BodyMinRate (bytes per second) bound how long a review holding its share
	// may take to send its body (DefaultBodyGrace). 0 means the defaults.
	BodyGrace   time.Duration
	BodyMinRate int64
	// Losses, when set, is told of every review of a route that could not be turned into a
	// stored candidate (busy, over a bound, body too slow or unreadable, invalid, dropped
	// before or by Redis): the join then credits no change of that route seen in that window
	// to one user's candidates alone.
	Losses *Losses
	// QueueSize and QueueBytes bound the candidates waiting to be recorded, by count and by
	// size; BatchSize and StoreTimeout shape the writes to Redis. 0 means the defaults.
	QueueSize, BatchSize int
	QueueBytes           int64
	StoreTimeout         time.Duration
	// Auth authenticates every request (401) before its body is read, and refuses (403) a
	// credential not bound to the request's route. Nil refuses every request.
	Auth *reviewhttp.Auth
	// ValidRoute reports whether a route names a cluster; nil accepts any DNS label.
	ValidRoute func(string) bool
	Logger     *slog.Logger // nil discards
	Metrics    *Metrics     // nil: registered nowhere
}

// Results of kubescribe_admission_reviews_total.
const (
	resultRecorded        = "recorded"         // stored as a candidate
	resultDryRun          = "dry_run"          // a dry run: nothing will be written
	resultIgnored         = "ignored"          // not a write a candidate can describe (CONNECT, another subresource)
	resultInvalid         = "invalid"          // the object could not be read (no uid, undecodable, no declared form)
	resultDroppedOverload = "dropped_overload" // the queue was full (by count or by bytes)
	resultDroppedStore    = "dropped_store"    // Redis did not take the batch
	resultDroppedBusy     = "dropped_busy"     // refused 429 before its body was read: the in-flight budget (or the credential's share of it) was spent
	resultDroppedBody     = "dropped_body"     // its body was refused or not read in time: too slow (408), cut off, too large (413), not JSON (415)
	resultUserTooLarge    = "user_too_large"   // userInfo past the caps: such a candidate could never credit anyone
)

// Metrics of the attribution webhook.
type Metrics struct {
	requests   *prometheus.CounterVec
	reviews    *prometheus.CounterVec
	queue      prometheus.Gauge
	queueBytes prometheus.Gauge
	inFlight   prometheus.Gauge
}

// NewMetrics registers the webhook's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_admission_attribution_requests_total",
			Help: "Requests to the attribution webhook (POST /validate/attribution/{route}) by HTTP status code.",
		}, []string{"code"}),
		reviews: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_admission_candidates_total",
			Help: "Admission reviews of watched writes by outcome: recorded, dry_run, ignored, invalid, user_too_large (userInfo past the caps), dropped_busy (429: the in-flight body budget, or the credential's share of it, was spent), dropped_body (body too slow, cut off, too large or not JSON), dropped_overload (queue full), dropped_store (Redis failed). Every outcome but recorded, dry_run and ignored makes its route doubtful for a while.",
		}, []string{"result"}),
		queue: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_admission_candidate_queue_depth",
			Help: "Admission candidates waiting to be recorded.",
		}),
		queueBytes: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_admission_candidate_queue_bytes",
			Help: "Size of the admission candidates waiting to be recorded (bounded by --admission-attribution-queue-bytes).",
		}),
		inFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_admission_inflight_body_bytes",
			Help: "Bytes of attribution review bodies being read and decoded now (bounded by --admission-attribution-inflight-bytes).",
		}),
	}
	for _, r := range []string{resultRecorded, resultDryRun, resultIgnored, resultInvalid, resultUserTooLarge, resultDroppedBusy, resultDroppedBody, resultDroppedOverload, resultDroppedStore} {
		m.reviews.WithLabelValues(r)
	}
	return m
}

// Handler serves the attribution webhook. It answers every review it can read with
// allowed: true, once it has turned it into a candidate (the objects decoded, the digest
// computed: nothing of the objects is kept); Run records the candidates in the background.
type Handler struct {
	opts   HandlerOptions
	log    *slog.Logger
	queue  chan Candidate
	queued atomic.Int64 // bytes of the queued candidates (candidateSize)
	budget *byteBudget
	mux    http.Handler
}

// NewHandler returns the webhook. Run must run for candidates to be recorded.
func NewHandler(opts HandlerOptions) (*Handler, error) {
	if opts.Store == nil || opts.Render == nil {
		return nil, errors.New("admission: HandlerOptions.Store and Render are required")
	}
	if opts.MaxBodyBytes < 0 || opts.InFlightBytes < 0 || opts.CallerInFlightBytes < 0 || opts.BodyWait < 0 || opts.BodyGrace < 0 ||
		opts.BodyMinRate < 0 || opts.QueueSize < 0 || opts.QueueBytes < 0 || opts.BatchSize < 0 || opts.StoreTimeout < 0 {
		return nil, errors.New("admission: HandlerOptions limits must not be negative")
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.InFlightBytes == 0 {
		opts.InFlightBytes = max(DefaultInFlightBytes, opts.MaxBodyBytes)
	}
	if opts.InFlightBytes < opts.MaxBodyBytes {
		return nil, fmt.Errorf("admission: the in-flight budget (%d bytes) must hold one review of the largest size (%d bytes)", opts.InFlightBytes, opts.MaxBodyBytes)
	}
	if opts.CallerInFlightBytes == 0 {
		opts.CallerInFlightBytes = max(opts.InFlightBytes/2, opts.MaxBodyBytes)
	}
	if opts.CallerInFlightBytes < opts.MaxBodyBytes || opts.CallerInFlightBytes > opts.InFlightBytes {
		return nil, fmt.Errorf("admission: the in-flight budget of one credential (%d bytes) must hold one review of the largest size (%d bytes) and fit the whole budget (%d bytes)",
			opts.CallerInFlightBytes, opts.MaxBodyBytes, opts.InFlightBytes)
	}
	if opts.BodyWait == 0 {
		opts.BodyWait = DefaultBodyWait
	}
	if opts.BodyGrace == 0 {
		opts.BodyGrace = DefaultBodyGrace
	}
	if opts.BodyMinRate == 0 {
		opts.BodyMinRate = DefaultBodyMinRate
	}
	if opts.QueueSize == 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.QueueBytes == 0 {
		opts.QueueBytes = DefaultQueueBytes
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.StoreTimeout == 0 {
		opts.StoreTimeout = DefaultStoreTimeout
	}
	if opts.ValidRoute == nil {
		opts.ValidRoute = audit.ValidRoute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	h := &Handler{opts: opts, log: opts.Logger.With("component", "admission"), queue: make(chan Candidate, opts.QueueSize),
		budget: newByteBudget(opts.InFlightBytes, opts.CallerInFlightBytes)}
	r := chi.NewRouter()
	r.Use(h.instrument)
	r.Post(PathPrefix+"{route}", h.serve)
	// A token in the last path segment authenticates the apiserver of a managed cluster.
	r.Post(PathPrefix+"{route}/{token}", h.serve)
	h.mux = r
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) instrument(next http.Handler) http.Handler {
	return reviewhttp.CountStatus(h.opts.Metrics.requests, next)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	// Who is calling, and may it speak for this route: before the body is read.
	caller, ok := h.opts.Auth.Authenticate(w, r, h.log, "attribution", chi.URLParam(r, "token"))
	if !ok {
		return
	}
	route := chi.URLParam(r, "route")
	if !h.opts.ValidRoute(route) {
		http.Error(w, fmt.Sprintf("route %q is not a cluster name (a DNS label)", route), http.StatusNotFound)
		return
	}
	if !h.opts.Auth.Permit(w, r, h.log, "attribution", caller, route) {
		return
	}
	h.review(w, r, route, string(caller.Method)+":"+caller.Name)
}

// lost records that a review of route could not become a stored candidate (Losses).
func (h *Handler) lost(route string) {
	h.opts.Losses.Lost(route, time.Now())
}

// bodyTime is how long a review holding share bytes of the budget may take to send its body.
func (h *Handler) bodyTime(share int64) time.Duration {
	return h.opts.BodyGrace + time.Duration(float64(share)/float64(h.opts.BodyMinRate)*float64(time.Second))
}

// review reads, decodes and answers an authenticated request for route, within its share of
// the in-flight budget, and of credential's.
func (h *Handler) review(w http.ResponseWriter, r *http.Request, route, credential string) {
	// The share is the announced length; a body of unknown length may be as large as the
	// limit; an announced length over the limit is refused by reviewhttp.Body unread.
	share := h.opts.MaxBodyBytes
	switch {
	case r.ContentLength > h.opts.MaxBodyBytes:
		share = 0
	case r.ContentLength >= 0:
		share = r.ContentLength
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.BodyWait)
	ok := h.budget.acquire(ctx, credential, share)
	cancel()
	if !ok {
		h.lost(route)
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedBusy).Inc()
		h.log.Debug("attribution review refused: the in-flight body budget is spent", "route", route, "contentLength", r.ContentLength,
			"budget", h.opts.InFlightBytes)
		w.Header().Set("Retry-After", "1")
		discardBody(w, r, h.opts.MaxBodyBytes, discardWait)
		http.Error(w, fmt.Sprintf("too many review bytes in flight (budget %d bytes); retry", h.opts.InFlightBytes), http.StatusTooManyRequests)
		return
	}
	h.opts.Metrics.inFlight.Add(float64(share))
	released := false
	release := func() {
		if !released {
			released = true
			h.budget.release(credential, share)
			h.opts.Metrics.inFlight.Sub(float64(share))
		}
	}
	defer release()

	// The share is held only as long as an apiserver takes to send such a body: a caller that
	// trickles it to keep the budget spent is cut off (408), and its route made doubtful.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(h.bodyTime(share)))
	body, ok := reviewhttp.Body(w, r, h.opts.MaxBodyBytes)
	_ = rc.SetReadDeadline(time.Time{})
	if !ok {
		h.lost(route)
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedBody).Inc()
		h.log.Debug("attribution review body refused or not read in time", "route", route, "contentLength", r.ContentLength, "credential", credential)
		return
	}
	req, err := reviewhttp.DecodeRequest(body)
	if err != nil {
		h.lost(route)
		h.log.Warn("undecodable admission review", "route", route, "err", err, "bytes", len(body))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	uid := req.UID
	h.take(route, req)
	release() // nothing of the body or the objects is used from here on
	reviewhttp.Respond(w, &admissionv1.AdmissionResponse{UID: uid, Allowed: true})
}

// take turns what req claims into a candidate and queues it, without waiting: a full queue
// (by count or by bytes) drops it and counts the loss.
func (h *Handler) take(route string, req *admissionv1.AdmissionRequest) {
	c, result, err := completeCandidate(route, req, h.opts.Render, h.opts.SecretDigest)
	if result != "" {
		if result != resultDryRun && result != resultIgnored {
			h.lost(route)
		}
		h.opts.Metrics.reviews.WithLabelValues(result).Inc()
		if err != nil {
			h.log.Warn("admission review describes no write kubescribe can confirm", "route", route, "operation", req.Operation,
				"resource", req.Resource.Resource, "subresource", req.SubResource, "namespace", req.Namespace, "name", req.Name,
				"request", req.UID, "result", result, "err", err)
		}
		return
	}
	size := candidateSize(&c)
	if h.queued.Add(size) > h.opts.QueueBytes {
		h.queued.Add(-size)
		h.lost(route)
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedOverload).Inc()
		return
	}
	select {
	case h.queue <- c:
		h.opts.Metrics.queue.Inc()
		h.opts.Metrics.queueBytes.Add(float64(size))
	default:
		h.queued.Add(-size)
		h.lost(route)
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedOverload).Inc()
	}
}

// Run records queued candidates, in batches, until ctx ends; it then records what is still
// queued, within one store timeout.
func (h *Handler) Run(ctx context.Context) {
	batch := make([]Candidate, 0, h.opts.BatchSize)
	for {
		var first Candidate
		select {
		case first = <-h.queue:
		case <-ctx.Done():
			h.drain(batch)
			return
		}
		batch = h.dequeued(batch[:0], first)
	fill:
		for len(batch) < h.opts.BatchSize {
			select {
			case c := <-h.queue:
				batch = h.dequeued(batch, c)
			default:
				break fill
			}
		}
		h.store(context.WithoutCancel(ctx), batch)
	}
}

// drain records whatever is still queued at shutdown.
func (h *Handler) drain(batch []Candidate) {
	batch = batch[:0]
	for {
		select {
		case c := <-h.queue:
			batch = h.dequeued(batch, c)
		default:
			h.store(context.Background(), batch)
			return
		}
	}
}

// dequeued appends c, taken off the queue, to batch.
func (h *Handler) dequeued(batch []Candidate, c Candidate) []Candidate {
	size := candidateSize(&c)
	h.queued.Add(-size)
	h.opts.Metrics.queue.Dec()
	h.opts.Metrics.queueBytes.Sub(float64(size))
	return append(batch, c)
}

func (h *Handler) store(ctx context.Context, batch []Candidate) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.StoreTimeout)
	defer cancel()
	if err := h.opts.Store.StoreCandidates(ctx, batch); err != nil {
		now := time.Now()
		for i := range batch {
			if i == 0 || batch[i].Route != batch[i-1].Route {
				h.opts.Losses.Lost(batch[i].Route, now)
			}
		}
		h.log.Warn("recording admission candidates failed; their writes may stay unattributed", "candidates", len(batch), "err", err)
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedStore).Add(float64(len(batch)))
		return
	}
	h.opts.Metrics.reviews.WithLabelValues(resultRecorded).Add(float64(len(batch)))
}

// discardWait bounds how long a refused review's body is read and dropped: as long as the
// listeners' read timeout (internal/app, 1m), which bounds any request's body anyway. Reading
// it keeps no memory, so the bound is not the in-flight wait (BodyWait): with 5s, a flood of
// 1 MB reviews on two cores busy compiling still had senders cut off with a broken pipe
// instead of their 429.
const discardWait = time.Minute

// discardBody reads and drops what is left of r's body, at most limit bytes and for at most
// wait, through a small buffer (nothing of it is kept), before a refusal is written. A server
// that answers without reading the body closes the connection when more than 256 KiB is left:
// a client still sending then gets a reset instead of the answer (seen under a flood of 1 MB
// reviews: "connection reset by peer" in place of the 429 that says "retry").
func discardBody(w http.ResponseWriter, r *http.Request, limit int64, wait time.Duration) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(wait))
	_, _ = io.CopyN(io.Discard, r.Body, limit)
	_ = rc.SetReadDeadline(time.Time{})
}
