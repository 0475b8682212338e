package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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
	// DefaultMaxBodyBytes: a review carries the object and, for an update, the old object; an
	// object is at most about 1.5 MiB (etcd's default request limit).
	DefaultMaxBodyBytes int64 = 4 << 20
	// DefaultQueueSize is how many reviews may wait to be recorded; past it they are dropped
	// (and counted), never waited for.
	DefaultQueueSize = 4096
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
	// MaxBodyBytes limits a review; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// QueueSize, BatchSize and StoreTimeout: 0 means the defaults.
	QueueSize, BatchSize int
	StoreTimeout         time.Duration
	// RequireClientCert refuses (401) a request without a verified TLS client certificate.
	RequireClientCert bool
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
	resultDroppedOverload = "dropped_overload" // the queue was full
	resultDroppedStore    = "dropped_store"    // Redis did not take the batch
)

// Metrics of the attribution webhook.
type Metrics struct {
	requests *prometheus.CounterVec
	reviews  *prometheus.CounterVec
	queue    prometheus.Gauge
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
			Help: "Admission reviews of watched writes by outcome: recorded, dry_run, ignored, invalid, dropped_overload (queue full), dropped_store (Redis failed).",
		}, []string{"result"}),
		queue: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_admission_candidate_queue_depth",
			Help: "Admission reviews waiting to be recorded as candidates.",
		}),
	}
	for _, r := range []string{resultRecorded, resultDryRun, resultIgnored, resultInvalid, resultDroppedOverload, resultDroppedStore} {
		m.reviews.WithLabelValues(r)
	}
	return m
}

// pending is one review waiting to become a candidate: the candidate without what needs the
// object decoded, and the raw objects.
type pending struct {
	c              Candidate
	object, oldObj []byte
}

// Handler serves the attribution webhook. It answers every review it can read with
// allowed: true at once; Run records the candidates in the background.
type Handler struct {
	opts  HandlerOptions
	log   *slog.Logger
	queue chan pending
	mux   http.Handler
}

// NewHandler returns the webhook. Run must run for candidates to be recorded.
func NewHandler(opts HandlerOptions) (*Handler, error) {
	if opts.Store == nil || opts.Render == nil {
		return nil, errors.New("admission: HandlerOptions.Store and Render are required")
	}
	if opts.MaxBodyBytes < 0 || opts.QueueSize < 0 || opts.BatchSize < 0 || opts.StoreTimeout < 0 {
		return nil, errors.New("admission: HandlerOptions limits must not be negative")
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.QueueSize == 0 {
		opts.QueueSize = DefaultQueueSize
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
	h := &Handler{opts: opts, log: opts.Logger.With("component", "admission"), queue: make(chan pending, opts.QueueSize)}
	r := chi.NewRouter()
	r.Use(h.instrument)
	r.Post(PathPrefix+"{route}", h.serve)
	h.mux = r
	return h, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

func (h *Handler) instrument(next http.Handler) http.Handler {
	return reviewhttp.CountStatus(h.opts.Metrics.requests, next)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	if !reviewhttp.Authenticated(w, r, h.log, h.opts.RequireClientCert) {
		return
	}
	route := chi.URLParam(r, "route")
	if !h.opts.ValidRoute(route) {
		http.Error(w, fmt.Sprintf("route %q is not a cluster name (a DNS label)", route), http.StatusNotFound)
		return
	}
	body, ok := reviewhttp.Body(w, r, h.opts.MaxBodyBytes)
	if !ok {
		return
	}
	req, err := reviewhttp.DecodeRequest(body)
	if err != nil {
		h.log.Warn("undecodable admission review", "route", route, "err", err, "bytes", len(body))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.take(route, req)
	reviewhttp.Respond(w, &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true})
}

// take queues what req claims, without waiting: a full queue drops it and counts the loss.
func (h *Handler) take(route string, req *admissionv1.AdmissionRequest) {
	if req.DryRun != nil && *req.DryRun {
		h.opts.Metrics.reviews.WithLabelValues(resultDryRun).Inc()
		return
	}
	op := string(req.Operation)
	switch {
	case op != OpCreate && op != OpUpdate && op != OpDelete,
		req.SubResource != "" && req.SubResource != "scale",
		req.SubResource == "scale" && op != OpUpdate:
		h.opts.Metrics.reviews.WithLabelValues(resultIgnored).Inc()
		return
	}
	p := pending{
		c: Candidate{
			Route: route, Group: req.Resource.Group, Resource: req.Resource.Resource, Subresource: req.SubResource,
			Namespace: req.Namespace, Name: req.Name, Operation: op,
			User:       audit.Identity{Username: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups},
			RequestUID: string(req.UID), Received: time.Now(),
		},
		object: req.Object.Raw, oldObj: req.OldObject.Raw,
	}
	if len(req.UserInfo.Extra) > 0 {
		p.c.User.Extra = make(map[string][]string, len(req.UserInfo.Extra))
		for k, v := range req.UserInfo.Extra {
			p.c.User.Extra[k] = v
		}
	}
	select {
	case h.queue <- p:
		h.opts.Metrics.queue.Inc()
	default:
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedOverload).Inc()
	}
}

// Run records queued reviews as candidates, in batches, until ctx ends; it then records what
// is still queued, within one store timeout.
func (h *Handler) Run(ctx context.Context) {
	batch := make([]Candidate, 0, h.opts.BatchSize)
	for {
		var first pending
		select {
		case first = <-h.queue:
		case <-ctx.Done():
			h.drain(batch)
			return
		}
		batch = h.appendCandidate(batch[:0], first)
	fill:
		for len(batch) < h.opts.BatchSize {
			select {
			case p := <-h.queue:
				batch = h.appendCandidate(batch, p)
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
		case p := <-h.queue:
			batch = h.appendCandidate(batch, p)
		default:
			h.store(context.Background(), batch)
			return
		}
	}
}

func (h *Handler) store(ctx context.Context, batch []Candidate) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.StoreTimeout)
	defer cancel()
	if err := h.opts.Store.StoreCandidates(ctx, batch); err != nil {
		h.log.Warn("recording admission candidates failed; their writes may stay unattributed", "candidates", len(batch), "err", err)
		h.opts.Metrics.reviews.WithLabelValues(resultDroppedStore).Add(float64(len(batch)))
		return
	}
	h.opts.Metrics.reviews.WithLabelValues(resultRecorded).Add(float64(len(batch)))
}

// appendCandidate completes p's candidate from its objects and appends it, or counts it
// invalid.
func (h *Handler) appendCandidate(batch []Candidate, p pending) []Candidate {
	h.opts.Metrics.queue.Dec()
	c, err := h.complete(p)
	if err != nil {
		h.log.Warn("admission review describes no write kubescribe can confirm", "route", p.c.Route, "operation", p.c.Operation,
			"resource", p.c.Resource, "subresource", p.c.Subresource, "namespace", p.c.Namespace, "name", p.c.Name, "err", err)
		h.opts.Metrics.reviews.WithLabelValues(resultInvalid).Inc()
		return batch
	}
	return append(batch, c)
}

// complete fills in the object's uid, name, base resourceVersion and digest.
func (h *Handler) complete(p pending) (Candidate, error) {
	c := p.c
	if c.Operation != OpCreate {
		old, err := decodeObject(p.oldObj, "oldObject")
		if err != nil {
			return c, err
		}
		c.UID, c.BaseResourceVersion = string(old.GetUID()), old.GetResourceVersion()
		if c.BaseResourceVersion == "" {
			return c, errors.New("oldObject has no metadata.resourceVersion")
		}
		if c.Name == "" {
			c.Name = old.GetName()
		}
	}
	if c.Operation == OpDelete {
		if c.UID == "" {
			return c, errors.New("oldObject has no metadata.uid")
		}
		return c, nil
	}
	obj, err := decodeObject(p.object, "object")
	if err != nil {
		return c, err
	}
	if uid := string(obj.GetUID()); uid != "" {
		c.UID = uid
	}
	if c.UID == "" {
		return c, errors.New("object has no metadata.uid")
	}
	if c.Name == "" {
		c.Name = obj.GetName() // a generateName create: the name is generated before admission
	}
	if c.Subresource == "scale" {
		r, found, err := unstructured.NestedInt64(obj.Object, "spec", "replicas")
		if err != nil {
			return c, fmt.Errorf("Scale object: spec.replicas: %v", err)
		}
		if !found {
			r = 0 // omitempty: a Scale to zero carries no replicas
		}
		c.Replicas = &r
		return c, nil
	}
	manifest, err := h.opts.Render(obj)
	if err != nil {
		return c, fmt.Errorf("declared form: %w", err)
	}
	c.Digest = Digest(manifest)
	return c, nil
}

func decodeObject(raw []byte, field string) (*unstructured.Unstructured, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("the review carries no %s", field)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("%s is not a Kubernetes object: %v", field, err)
	}
	return u, nil
}
