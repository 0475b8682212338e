package authz

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
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// Path is where the webhook is served; Path + "/<token>" too, for a token-authenticated
// apiserver.
const Path = "/validate/commitrequests"

// webhookName names the webhook in logs and metrics.
const webhookName = "commitrequests"

// reviewTimeout bounds the SubjectAccessReview and the verdict write of one request; the
// webhook's own timeout (deploy/) is 5s.
const reviewTimeout = 3 * time.Second

// AccessReviewer creates SubjectAccessReviews; the typed client's
// AuthorizationV1().SubjectAccessReviews() implements it.
type AccessReviewer interface {
	Create(ctx context.Context, sar *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
}

// VerdictRecorder stores verdicts; Store implements it.
type VerdictRecorder interface {
	Record(ctx context.Context, v Verdict) error
}

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Reviewer checks assert-author. Required.
	Reviewer AccessReviewer
	// Verdicts records the verdicts. Required.
	Verdicts VerdictRecorder
	// SecretRefs records the verdicts of Secret references (SecretRefsPath); nil records none,
	// so no GitProvider or GitTarget naming a Secret is ever vouched for.
	SecretRefs SecretRefRecorder
	// MaxBodyBytes limits a review; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Auth authenticates every request (401) before its body is read, and refuses (403) a
	// credential not bound to Route. Nil refuses every request.
	Auth *reviewhttp.Auth
	// Route is the route of the cluster kubescribe runs in (--cluster-name): the CommitRequest
	// webhook serves only that cluster's apiserver. Required.
	Route string
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Metrics defaults to metrics registered nowhere.
	Metrics *Metrics
}

// Metrics of the admission endpoint.
type Metrics struct {
	requests *prometheus.CounterVec
	verdicts *prometheus.CounterVec
}

// Verdict labels of kubescribe_authz_verdicts_total.
const (
	verdictSubmitter  = "submitter"  // recorded without an asserted author
	verdictAuthorized = "authorized" // assertion allowed and recorded
	verdictDenied     = "denied"     // assertion refused at admission
	verdictUnrecorded = "unrecorded" // nothing recorded: a dry run, or a failure (a request asserting an author is then refused)
)

// NewMetrics registers the admission metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_authz_requests_total",
			Help: "Requests to the admission endpoint by HTTP status code.",
		}, []string{"code"}),
		verdicts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_authz_verdicts_total",
			Help: "CommitRequest creates reviewed, by outcome (submitter, authorized, denied, unrecorded).",
		}, []string{"verdict"}),
	}
	for _, v := range []string{verdictSubmitter, verdictAuthorized, verdictDenied, verdictUnrecorded} {
		m.verdicts.WithLabelValues(v)
	}
	return m
}

type handler struct {
	opts HandlerOptions
	log  *slog.Logger
}

// NewHandler returns the admission endpoint: POST /validate/commitrequests with an
// admission.k8s.io/v1 AdmissionReview. Answers 200 with a review response for every decodable
// review; 401 for a caller not authenticated, 403 for a credential not bound to Route (both
// before the body is read), 400 for a body that is not a review, 413 over the limit, 415 for a
// content type other than JSON.
func NewHandler(opts HandlerOptions) (http.Handler, error) {
	if opts.Reviewer == nil || opts.Verdicts == nil {
		return nil, errors.New("authz: HandlerOptions.Reviewer and Verdicts are required")
	}
	if opts.Route == "" {
		return nil, errors.New("authz: HandlerOptions.Route is required")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("authz: HandlerOptions.MaxBodyBytes must not be negative, got %d", opts.MaxBodyBytes)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	h := &handler{opts: opts, log: opts.Logger.With("component", "authz")}
	r := chi.NewRouter()
	r.Use(h.instrument)
	r.Post(Path, h.serve)
	// A token in the last path segment authenticates the apiserver of a managed cluster.
	r.Post(Path+"/{token}", h.serve)
	r.Post(SecretRefsPath, h.serveSecretRefs)
	r.Post(SecretRefsPath+"/{token}", h.serveSecretRefs)
	return r, nil
}

func (h *handler) instrument(next http.Handler) http.Handler {
	return reviewhttp.CountStatus(h.opts.Metrics.requests, next)
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request) {
	// Who is calling, and may it speak for this cluster: before the body is read and before
	// any SubjectAccessReview, so a stranger costs kubescribe nothing.
	caller, ok := h.opts.Auth.Authenticate(w, r, h.log, webhookName, chi.URLParam(r, "token"))
	if !ok || !h.opts.Auth.Permit(w, r, h.log, webhookName, caller, h.opts.Route) {
		return
	}
	body, ok := reviewhttp.Body(w, r, h.opts.MaxBodyBytes)
	if !ok {
		return
	}
	rv, err := decodeReview(body)
	if err != nil {
		h.log.Warn("undecodable admission review", "err", err, "bytes", len(body))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	reviewhttp.Respond(w, h.review(r.Context(), rv))
}

// review decides one request: it never denies a create without spec.author, and denies one
// with spec.author when the submitter may not assert-author on the target.
func (h *handler) review(ctx context.Context, rv *review) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: rv.req.UID, Allowed: true}
	if rv.obj == nil {
		return resp // not a CommitRequest create: nothing to decide
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	cr, req := rv.obj, rv.req
	dryRun := req.DryRun != nil && *req.DryRun
	v := Verdict{
		UID: cr.UID, Namespace: req.Namespace, Name: cr.Name, Target: cr.Spec.TargetRef.Name,
		Submitter: Submitter{Username: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups},
	}
	if len(req.UserInfo.Extra) > 0 {
		v.Submitter.Extra = make(map[string][]string, len(req.UserInfo.Extra))
		for k, e := range req.UserInfo.Extra {
			v.Submitter.Extra[k] = e
		}
	}
	log := h.log.With("namespace", req.Namespace, "name", cr.Name, "uid", string(cr.UID), "user", req.UserInfo.Username, "target", v.Target)
	outcome := verdictSubmitter
	if a := cr.Spec.Author; a != nil {
		v.Author = &Author{Name: a.Name, Email: a.Email}
		allowed, err := h.mayAssert(ctx, req, v)
		switch {
		case err != nil:
			// The assertion cannot be verified now: admit the request, record nothing of the
			// assertion, and say so. The controller then ignores spec.author.
			log.Warn("assert-author check failed; the asserted author will be ignored", "err", err)
			resp.Warnings = append(resp.Warnings, "kubescribe could not check assert-author; spec.author will be ignored")
		case !allowed:
			h.opts.Metrics.verdicts.WithLabelValues(verdictDenied).Inc()
			log.Info("assert-author denied")
			resp.Allowed = false
			resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
				Reason: metav1.StatusReasonForbidden, Message: DeniedMessage(req.UserInfo.Username, req.Namespace, v.Target)}
			return resp
		default:
			v.Authorized = true
			outcome = verdictAuthorized
		}
	}
	if dryRun {
		h.opts.Metrics.verdicts.WithLabelValues(verdictUnrecorded).Inc()
		return resp // a dry run records nothing
	}
	if err := h.opts.Verdicts.Record(ctx, v); err != nil {
		h.opts.Metrics.verdicts.WithLabelValues(verdictUnrecorded).Inc()
		if v.Author != nil {
			// Fail closed, as the webhook's failurePolicy does for an assertion: admitted
			// without a verdict, the request would wait for one that anyone holding an admission
			// credential could then supply first.
			log.Error("recording the verdict failed; the request asserting an author is refused", "err", err)
			resp.Allowed = false
			resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable,
				Reason:  metav1.StatusReasonServiceUnavailable,
				Message: "kubescribe could not record the verdict of this request, so spec.author could not be honoured: create it again later, or without spec.author"}
			return resp
		}
		log.Error("recording the verdict failed; the request is admitted but closes no window", "err", err)
		resp.Warnings = append(resp.Warnings, "kubescribe could not record who submitted this request: it will close no window")
		return resp
	}
	h.opts.Metrics.verdicts.WithLabelValues(outcome).Inc()
	log.Info("commit request admitted", "authorAsserted", v.Author != nil, "authorized", v.Authorized)
	return resp
}

// SubjectAccessReview builds the check of whether the submitter of a CommitRequest may assert a
// commit author on its GitTarget.
func SubjectAccessReview(u Submitter, namespace, target string) *authorizationv1.SubjectAccessReview {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   u.Username,
		UID:    u.UID,
		Groups: u.Groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace,
			Verb:      v1alpha1.AssertAuthorVerb,
			Group:     v1alpha1.GroupName,
			Resource:  "gittargets",
			Name:      target,
		},
	}}
	if len(u.Extra) > 0 {
		sar.Spec.Extra = make(map[string]authorizationv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			sar.Spec.Extra[k] = v
		}
	}
	return sar
}

func (h *handler) mayAssert(ctx context.Context, req *admissionv1.AdmissionRequest, v Verdict) (bool, error) {
	res, err := h.opts.Reviewer.Create(ctx, SubjectAccessReview(v.Submitter, req.Namespace, v.Target), metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if res.Status.EvaluationError != "" && !res.Status.Allowed {
		h.log.Debug("SubjectAccessReview evaluation error", "err", res.Status.EvaluationError)
	}
	return res.Status.Allowed, nil
}

// DeniedMessage is the denial of a CommitRequest whose submitter may not assert an author: it
// names the RBAC rule that would grant it.
func DeniedMessage(user, namespace, target string) string {
	return fmt.Sprintf("user %q may not set spec.author on a CommitRequest for GitTarget %q: that needs the RBAC rule "+
		"{apiGroups: [\"kubescribe.dev\"], resources: [\"gittargets\"], resourceNames: [%q], verbs: [\"assert-author\"]} "+
		"in a Role of namespace %q (or a ClusterRole) bound to the user; remove spec.author to commit under your own name",
		user, target, target, namespace)
}
