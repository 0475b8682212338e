package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxBodyBytes is the default limit on an EventList body.
const DefaultMaxBodyBytes int64 = 10 << 20

// FactStore makes facts durable. internal/attribution implements it. StoreFacts returns nil
// only once every fact is stored; the handler acknowledges the batch only then. The facts and
// everything they point to belong to the handler: StoreFacts must not keep them after it
// returns (the handler reuses their memory for the next batch).
type FactStore interface {
	StoreFacts(ctx context.Context, facts []Fact) error
}

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Store receives the facts of every batch. Required.
	Store FactStore
	// MaxBodyBytes limits an EventList body; larger bodies are answered 413. Zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Authenticator decides who may post, and for which routes. Its zero value authenticates
	// nobody.
	Authenticator Authenticator
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Metrics defaults to metrics registered nowhere.
	Metrics *Metrics
	// Deliveries, when set, is told of every batch stored and every batch the store failed
	// (the join waits longer for the facts the apiserver may still be retrying).
	Deliveries *Deliveries
}

var routeRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// MaxRouteLength is the longest route name accepted (a DNS label).
const MaxRouteLength = 63

// ValidRoute reports whether route may name a source cluster: a DNS label, lower-case
// alphanumerics and '-', starting and ending with an alphanumeric, at most 63 characters.
func ValidRoute(route string) bool {
	return len(route) <= MaxRouteLength && routeRE.MatchString(route)
}

type handler struct {
	store      FactStore
	max        int64
	authn      Authenticator
	log        *slog.Logger
	metrics    *Metrics
	deliveries *Deliveries
}

// NewHandler returns the audit webhook endpoint: POST /audit/{route}, where route names the
// source cluster (see ValidRoute). Every request is authenticated first (401 otherwise), and
// its credential must be bound to the route (403 otherwise), before its body is read.
// Answers: 200 once the batch's facts are stored, 400 for a body that is not an
// audit.k8s.io/v1 EventList, 404 for an unknown path or an invalid route, 405 for a method
// other than POST, 413 for a body over the limit, 503 when the store fails (the apiserver
// retries the batch).
func NewHandler(opts HandlerOptions) (http.Handler, error) {
	if opts.Store == nil {
		return nil, errors.New("audit: HandlerOptions.Store is required")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("audit: HandlerOptions.MaxBodyBytes must not be negative, got %d", opts.MaxBodyBytes)
	}
	h := &handler{
		store:   opts.Store,
		max:     opts.MaxBodyBytes,
		authn:   opts.Authenticator,
		log:     opts.Logger,
		metrics: opts.Metrics,

		deliveries: opts.Deliveries,
	}
	if h.max == 0 {
		h.max = DefaultMaxBodyBytes
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.log = h.log.With("component", "audit")
	if h.metrics == nil {
		h.metrics = NewMetrics(prometheus.NewRegistry())
	}

	r := chi.NewRouter()
	r.Use(h.instrument, h.authenticate)
	r.Post("/audit/{route}", h.serveAudit)
	return r, nil
}

// instrument counts every answer, including chi's 404 and 405, by status code.
func (h *handler) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		code := ww.Status()
		if code == 0 {
			code = http.StatusOK
		}
		h.metrics.requests.WithLabelValues(strconv.Itoa(code)).Inc()
		h.metrics.duration.Observe(time.Since(start).Seconds())
	})
}

type callerKey struct{}

func (h *handler) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, ok := h.authn.Authenticate(r)
		if !ok {
			// Say whether credentials were presented, never what they were.
			_, hasToken := bearerToken(r)
			h.log.Warn("unauthenticated audit request", "remote", r.RemoteAddr, "path", r.URL.Path,
				"tls", r.TLS != nil, "bearer", hasToken)
			h.metrics.refused.WithLabelValues(refusedUnauthenticated).Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="kubescribe-audit"`)
			http.Error(w, "unauthenticated: present a client certificate signed by the audit client CA or a valid bearer token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
	})
}

// mayPost answers 403, and returns false, unless the authenticated caller is bound to route.
func (h *handler) mayPost(w http.ResponseWriter, r *http.Request, route string) bool {
	caller, _ := r.Context().Value(callerKey{}).(Caller)
	if caller.MayPost(route) {
		return true
	}
	// The credential's name (a common name, a token file line), never the credential.
	h.log.Warn("audit credential not bound to the route", "route", route, "remote", r.RemoteAddr,
		"method", string(caller.Method), "credential", caller.Name)
	h.metrics.refused.WithLabelValues(refusedRouteNotBound).Inc()
	http.Error(w, fmt.Sprintf("forbidden: this credential may not post audit events for route %q", route), http.StatusForbidden)
	return false
}

func (h *handler) serveAudit(w http.ResponseWriter, r *http.Request) {
	route := chi.URLParam(r, "route")
	if !ValidRoute(route) {
		http.Error(w, "invalid route: want a DNS label (lower-case alphanumerics and '-', at most 63 characters)", http.StatusNotFound)
		return
	}
	if !h.mayPost(w, r, route) {
		return
	}
	start := time.Now()
	defer func() { h.metrics.observeHandler(route, time.Since(start)) }()
	log := h.log.With("route", route)
	if r.ContentLength > h.max {
		log.Warn("audit batch too large", "contentLength", r.ContentLength, "limit", h.max)
		http.Error(w, fmt.Sprintf("body exceeds %d bytes", h.max), http.StatusRequestEntityTooLarge)
		return
	}
	buf := getBody(r.ContentLength)
	defer putBody(buf)
	body, err := readBody(r.Body, *buf, h.max)
	*buf = body[:0] // keep what the read grew
	if errors.Is(err, errTooLarge) {
		log.Warn("audit batch too large", "limit", h.max)
		http.Error(w, fmt.Sprintf("body exceeds %d bytes", h.max), http.StatusRequestEntityTooLarge)
		return
	}
	if err != nil {
		log.Warn("reading audit batch", "err", err)
		http.Error(w, "unable to read body", http.StatusBadRequest)
		return
	}
	h.metrics.batchBytes.Observe(float64(len(body)))

	d := getDecoder()
	defer putDecoder(d) // after the store returned: the facts live in d
	facts, stats, err := d.decode(body, route)
	if err != nil {
		log.Warn("undecodable audit batch", "err", err, "bytes", len(body))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(facts) > 0 {
		if err := h.store.StoreFacts(r.Context(), facts); err != nil {
			h.deliveries.Failed(route, time.Now())
			log.Error("storing audit facts failed; answering 503 so the apiserver retries",
				"err", err, "facts", len(facts), "events", stats.Events)
			http.Error(w, "fact store unavailable", http.StatusServiceUnavailable)
			return
		}
	}
	h.metrics.observeStats(stats)
	if len(stats.Malformed) > 0 {
		// Position and auditID only: the event's content may be anything a user wrote.
		log.Debug("dropped malformed audit events", "count", len(stats.Malformed),
			"events", malformedSummary(stats.Malformed, maxLoggedMalformed))
	}
	log.Debug("audit batch stored", "events", stats.Events, "facts", stats.Kept)
	h.deliveries.Delivered(route, time.Now())
	w.WriteHeader(http.StatusOK)
}

// Bodies are read into reused buffers: a batch costs no allocation that grows with its size
// once a buffer as large as the batches is kept. Unlike a sync.Pool, the few kept buffers are
// not dropped by every garbage collection.
var bodies = make(chan *[]byte, 4)

// minBodyBuffer is the first size of a buffer for a body of unknown length.
const minBodyBuffer = 64 << 10

// getBody returns a pooled buffer (length 0) with room for a body of contentLength bytes (the
// caller checked it against the limit) and one more, to tell a body longer than declared.
func getBody(contentLength int64) *[]byte {
	want := minBodyBuffer
	if contentLength >= 0 {
		want = int(contentLength) + 1
	}
	select {
	case p := <-bodies:
		if cap(*p) >= want {
			return p
		}
		// Too small for this body: drop it, so that the kept buffers grow to the batch size.
	default:
	}
	b := make([]byte, 0, want)
	return &b
}

func putBody(p *[]byte) {
	*p = (*p)[:0]
	select {
	case bodies <- p:
	default:
	}
	keptIdle.Reset(keepIdle)
}

// keepIdle is how long the kept body buffers and decoders outlive the last batch. They are
// kept for a steady stream of batches; once the apiserver has had nothing to send for that
// long, they are dropped, so that a burst of large batches does not leave megabytes behind
// (cmd/server returns free memory to the OS after a quiet spell longer than this).
var keepIdle = 5 * time.Second

// keptIdle drops the kept bodies and decoders keepIdle after the last batch; every batch
// postpones it.
var keptIdle = time.AfterFunc(time.Hour, dropKept)

func init() { keptIdle.Stop() }

func dropKept() {
	for {
		select {
		case <-bodies:
		case <-decoders:
		default:
			return
		}
	}
}

var errTooLarge = errors.New("body exceeds the limit")

// readBody appends r to buf until EOF and returns it; errTooLarge once more than limit bytes were
// read. It grows buf only when the body is longer than buf's capacity.
func readBody(r io.Reader, buf []byte, limit int64) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return buf, errTooLarge
			}
			buf = slices.Grow(buf, min(max(cap(buf), minBodyBuffer), int(limit)+1-len(buf)))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return buf, errTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// maxLoggedMalformed bounds how many malformed events one log line names.
const maxLoggedMalformed = 10

// malformedSummary names up to max malformed events as "items[i]" or "items[i] auditID".
func malformedSummary(evs []MalformedEvent, max int) []string {
	out := make([]string, 0, min(len(evs), max))
	for _, e := range evs[:min(len(evs), max)] {
		s := "items[" + strconv.Itoa(e.Index) + "]"
		if e.AuditID != "" {
			s += " " + e.AuditID
		}
		out = append(out, s)
	}
	return out
}
