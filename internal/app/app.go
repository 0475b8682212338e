package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/controller"
	"github.com/kubescribe/kubescribe/internal/declared"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/ownership"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
	"github.com/kubescribe/kubescribe/internal/secretenc"
	"github.com/kubescribe/kubescribe/internal/selftls"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// HTTP limits shared by both listeners. Audit batches are large (about 1 MB for 400 events)
// but arrive quickly from a client on a fast network.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = time.Minute
	writeTimeout      = time.Minute
	maxHeaderBytes    = 64 << 10
	// http2ReadFrameSize is the largest HTTP/2 frame the listeners accept: the protocol's
	// minimum (RFC 9113, 4.2). An HTTP/2 connection keeps a read buffer as large as the largest
	// frame it has read, for as long as it lives; with Go's default of 1 MiB, the apiserver's
	// audit connection, which audit traffic keeps open, held about 0.8 MB after one large batch.
	// Smaller frames cost a frame header per 16 KiB of a batch.
	http2ReadFrameSize = 16 << 10
)

// App is a configured kubescribe, its listeners already bound.
type App struct {
	opts Options
	log  *slog.Logger
	// secretDigest is the keyed digest of Secrets' writes (Options.SecretDigestKey), nil
	// without a key.
	secretDigest func([]byte) [32]byte
	ready        atomic.Bool
	// life stops, newest first, every part that started.
	life lifecycle

	rdb    redis.UniversalClient
	store  *attribution.Store
	joiner *attribution.Joiner
	// deliveries: which routes' audit batches may have failed (the join's long wait).
	deliveries *audit.Deliveries
	sources    *watch.Registry
	router     *git.Router
	controller *controller.Controller

	// reviewLosses: which routes' admission reviews may have been lost (the join then credits
	// no change to one user's candidates alone).
	reviewLosses *admission.Losses

	// membership shares the branches among the replicas (Coordination leases); nil with none.
	membership *ownership.Membership
	// stopping is when the shutdown began (zero before).
	stopping time.Time

	// tls serves the listeners' certificates and client CAs, reloaded when they change.
	tls *listenerTLS
	// selfTLS keeps the self-managed certificates current (--tls-self-managed-secret); nil
	// without.
	selfTLS *selftls.Manager
	// auditTokens is --audit-token-file, read again when it changes; nil without one.
	auditTokens *audit.TokenFile
	// serving is the audit listener's certificate; admissionServing the admission and metrics
	// listeners' (the same unless --admission-tls-cert-file).
	serving, admissionServing dynamiccertificates.CertKeyContentProvider

	auditLn, opsLn   net.Listener
	auditSrv, opsSrv *http.Server
	// The admission listener and server; nil when disabled.
	admissionLn  net.Listener
	admissionSrv *http.Server
	// The metrics listener and server; nil when disabled.
	metricsLn  net.Listener
	metricsSrv *http.Server
	// candidates is the attribution webhook (on the admission listener); nil when disabled.
	candidates *admission.Handler
}

// New validates opts, builds every part and binds the listeners, so that a bad flag, an
// unreadable certificate or a taken port fails here, before anything runs.
func New(opts Options) (_ *App, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	a := &App{opts: opts, log: opts.Logger}
	// A failure part-way stops whatever started before it (the Redis client, a listener).
	defer func() {
		if err != nil {
			err = errors.Join(err, a.life.stop(context.Background()))
		}
	}()

	// Certificate files are read first (a typo in a path fails before anything else is
	// tried); the self-managed certificate needs the Kubernetes client.
	a.tls = newListenerTLS(a.log.With("component", "tls"), opts.Registry)
	if opts.TLSSelfManagedSecret == "" {
		if err := a.servingFiles(); err != nil {
			return nil, err
		}
	}
	restConfig, err := a.restConfig()
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	if opts.TLSSelfManagedSecret != "" {
		if err := a.selfManagedCertificates(kube); err != nil {
			return nil, err
		}
	}
	tlsConfig, authn, err := a.auditSecurity()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating the dynamic client: %w", err)
	}
	meta, err := metadata.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating the metadata client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("creating the discovery client: %w", err)
	}

	prefix, _ := keyspace.Parse(opts.RedisKeyPrefix) // validated above
	var redisDial func(context.Context, string, string) (net.Conn, error)
	if opts.RedisTLSEnabled() {
		rt, err := a.tls.redisClientTLS(opts)
		if err != nil {
			return nil, err
		}
		redisDial = rt.dial
	}
	if opts.RedisMasterName != "" && opts.RedisSentinelPassword == "" && opts.RedisSentinelInsecureAllowUnauthenticated {
		a.log.Warn("UNSAFE: the Redis Sentinels are used without authentication (--redis-sentinel-insecure-allow-unauthenticated): "+
			"whoever reaches one can re-point it at their own listener, which then receives the Redis password", "component", "redis")
	}
	a.rdb = newRedisClient(opts, a.log.With("component", "redis"), opts.Registry, redisDial)
	a.life.onStop("redis", func(context.Context) error { return a.rdb.Close() })
	a.store = attribution.NewStore(a.rdb, prefix, opts.FactTTL)
	a.store.SetCandidateTTL(opts.CandidateTTL)
	a.store.SetFactWindow(opts.FactMaxDelay, opts.FactClockSkew)
	attributionMetrics := attribution.NewMetrics(opts.Registry)
	a.store.SetObservability(a.log.With("component", "attribution"), attributionMetrics)
	watchMetrics := watch.NewMetrics(opts.Registry)
	a.deliveries = audit.NewDeliveries(a.store)
	a.reviewLosses = admission.NewLosses(a.store)
	a.joiner, err = attribution.NewJoiner(attribution.JoinerOptions{
		Facts:       a.store,
		Candidates:  a.store,
		Grace:       opts.AttributionGrace,
		ResumeGrace: opts.AttributionResumeGrace,
		Deliveries:  a.deliveries,
		WaitClock:   a.store,
		Logger:      a.log.With("component", "attribution"),
		Metrics:     attributionMetrics,
		Excluded: func(c watch.Change) {
			watchMetrics.Excluded(c.Target, c.GVR, watch.ReasonUser)
		},
		// A lost admission review makes its route's changes doubtful (issue 36, finding 1).
		ReviewLosses: a.reviewLosses,
	})
	if err != nil {
		return nil, err
	}
	// The local cluster's source; the audit route names it (a remote cluster may get its own).
	src, _ := attribution.ParseSource(opts.AttributionSource) // validated above
	a.joiner.SetSource(opts.ClusterName, src)
	cursors := watch.NewCursorStore(a.rdb, prefix)
	if opts.SecretDigestKey != nil {
		d, err := secretenc.NewDigester(opts.SecretDigestKey) // Validate checked its size
		if err != nil {
			return nil, err
		}
		a.secretDigest = d.Sum
	}
	a.sources, err = watch.NewRegistry(watch.RegistryOptions{
		SecretDigest:     a.secretDigest,
		Render:           declared.Manifest,
		Emit:             func(c watch.Change) { a.joiner.Join(c, a.router.Deliver) },
		Logger:           a.log.With("component", "watch"),
		Metrics:          watchMetrics,
		Cursors:          cursors,
		Resumable:        func(s watch.StreamID) bool { return a.controller != nil && a.controller.Resumable(s) },
		DiscoveryRefresh: opts.DiscoveryRefresh,
	})
	if err != nil {
		return nil, err
	}
	a.router = git.NewRouter(git.RouterOptions{Metrics: git.NewMetrics(opts.Registry), Logger: a.log, Cursors: cursors,
		Closes: git.NewCloseStore(a.rdb, prefix), Epochs: git.NewWriterEpochs(a.rdb, prefix), Pushes: git.NewDeliveries(a.rdb, prefix), SupersededHold: opts.LeaseDuration,
		Streams: a.sources})
	var owners controller.Ownership
	if opts.Coordination == CoordinationLeases {
		if a.membership, err = a.newMembership(kube); err != nil {
			return nil, err
		}
		owners = a.membership
	}
	// The cluster kubescribe runs in is the first source cluster, under its audit route.
	if _, err := a.sources.AddCluster(opts.ClusterName, dyn, memory.NewMemCacheClient(dc)); err != nil {
		return nil, err
	}
	verdicts := authz.NewStore(a.rdb, prefix, opts.VerdictTTL)
	secretRefs := authz.NewSecretRefStore(a.rdb, prefix)
	var checkedRefs controller.SecretRefVerdicts = secretRefs
	if opts.InsecureSkipSecretReferenceCheck {
		checkedRefs = nil
		a.log.Warn("UNSAFE: Secret references are not checked (--insecure-skip-secret-reference-check): whoever may write a GitProvider or GitTarget has kubescribe use any Secret of its namespace")
	} else if opts.AdmissionListenAddress == "" {
		a.log.Warn("no admission listener: nothing vouches for the Secrets GitProviders and GitTargets name, so those naming one stay SecretReferenceUnverified")
	}
	webhook, err := a.attributionWebhook()
	if err != nil {
		return nil, err
	}
	a.controller, err = controller.New(controller.Options{
		AttributionWebhook: webhook,
		Client:             dyn,
		Kube:               kube,
		Sources:            a.sources,
		Cluster:            opts.ClusterName,
		Router:             a.router,
		Logger:             a.log, // the controller tags its own and its workers' loggers
		Registerer:         opts.Registry,
		Verdicts:           verdicts,
		CommitRequestTTL:   opts.CommitRequestTTL,

		Metadata:                      meta,
		AllowRemoteKubeconfigExec:     opts.AllowRemoteKubeconfigExec,
		AllowRemoteKubeconfigInsecure: opts.AllowRemoteKubeconfigInsecure,
		AuditRouteNamespaces:          opts.AuditRouteNamespaces,
		SecretRefs:                    checkedRefs,
		Cursors:                       cursors,
		InFlight:                      a.joiner.InFlight,
		Drained:                       a.joiner.Drained(),
		DrainedTargets:                a.joiner.DrainedTargets,
		Ownership:                     owners,
		Handovers:                     ownership.NewHandovers(opts.Registry),
	})
	if err != nil {
		return nil, err
	}
	auditHandler, err := audit.NewHandler(audit.HandlerOptions{
		Deliveries:    a.deliveries,
		Store:         a.store,
		MaxBodyBytes:  opts.AuditMaxBodyBytes,
		Authenticator: authn,
		Logger:        a.log,
		Metrics:       audit.NewMetrics(opts.Registry),
	})
	if err != nil {
		return nil, err
	}

	a.auditSrv = newServer(auditHandler, a.log)
	a.auditSrv.TLSConfig = tlsConfig
	a.opsSrv = newServer(a.opsHandler(), a.log)
	if a.auditLn, err = a.listen("audit", opts.AuditListenAddress); err != nil {
		return nil, err
	}
	if a.opsLn, err = a.listen("ops", opts.OpsListenAddress); err != nil {
		return nil, err
	}
	if opts.AdmissionListenAddress != "" {
		if err := a.admission(kube, verdicts, secretRefs); err != nil {
			return nil, err
		}
	}
	if opts.MetricsListenAddress != "" {
		if err := a.metrics(restConfig); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// servingFiles loads the listeners' serving certificates from files: the audit listener's
// (--tls-cert-file), and the admission and metrics listeners' (--admission-tls-cert-file, else
// the audit listener's).
func (a *App) servingFiles() error {
	var err error
	if a.serving, err = a.tls.servingFiles("audit serving certificate", a.opts.TLSCertFile, a.opts.TLSKeyFile); err != nil {
		return err
	}
	a.admissionServing = a.serving
	if a.opts.AdmissionTLSCertFile != "" {
		if a.admissionServing, err = a.tls.servingFiles("admission serving certificate", a.opts.AdmissionTLSCertFile, a.opts.AdmissionTLSKeyFile); err != nil {
			return err
		}
	}
	return nil
}

// selfManagedStartTimeout bounds how long New waits for the self-managed TLS Secret to be read
// or created (the apiserver unreachable, say): the listeners have nothing to serve before.
const selfManagedStartTimeout = 30 * time.Second

// selfManagedCertificates brings the self-managed TLS Secret up to date, creating it when it
// does not exist, and serves its certificate on every listener.
func (a *App) selfManagedCertificates(kube kubernetes.Interface) error {
	namespace, name, _ := a.opts.SelfManagedSecret() // validated
	policy, _ := a.opts.SelfManagedPolicy()          // validated
	m, err := selftls.New(selftls.Options{
		Client: kube, Namespace: namespace, Name: name, Policy: policy,
		Webhooks: a.opts.TLSSelfManagedWebhooks, CheckInterval: a.opts.TLSSelfManagedCheckInterval,
		Logger: a.log, Registerer: a.opts.Registry,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), selfManagedStartTimeout)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("self-managed TLS (--tls-self-managed-secret %s): %w", a.opts.TLSSelfManagedSecret, err)
	}
	a.selfTLS, a.serving, a.admissionServing = m, m, m
	return nil
}

// metrics builds the metrics server and binds its listener: TLS with the admission listener's
// certificate, and every request authenticated and authorized against the Kubernetes API
// unless the options opt out.
func (a *App) metrics(restConfig *rest.Config) error {
	log := a.log.With("component", "metrics")
	var auth *metricsAuth
	if a.opts.MetricsInsecureAllowUnauthenticated {
		log.Warn("UNSAFE: /metrics is served without authentication or authorization (--metrics-insecure-allow-unauthenticated): " +
			"anyone who reaches the metrics port can read it; guard it with a NetworkPolicy or an authenticating proxy")
	} else {
		// A client of its own (same identity), so that callers of the metrics port, whose
		// reviews it makes, never spend the client-side rate limit of the controller's client.
		kube, err := kubernetes.NewForConfig(restConfig)
		if err != nil {
			return fmt.Errorf("creating the metrics review client: %w", err)
		}
		auth = newMetricsAuth(kube, log, a.opts.Registry)
	}
	cfg, err := a.tls.config("metrics", a.admissionServing, nil)
	if err != nil {
		return err
	}
	a.metricsSrv = newServer(metricsHandler(a.opts.Registry, auth), a.log)
	a.metricsSrv.TLSConfig = cfg
	a.metricsLn, err = a.listen("metrics", a.opts.MetricsListenAddress)
	return err
}

// admission builds the admission webhook's server and binds its listener.
func (a *App) admission(kube kubernetes.Interface, verdicts *authz.Store, secretRefs *authz.SecretRefStore) error {
	auth, err := a.admissionAuth()
	if err != nil {
		return err
	}
	// A client certificate, when given, must verify against the admission client CA; a managed
	// cluster's apiserver presents none and authenticates with the token in its webhook's URL
	// path.
	var clientCA dynamiccertificates.CAContentProvider
	if a.opts.AdmissionClientCAFile != "" {
		if clientCA, err = a.tls.clientCAFile("admission", a.opts.AdmissionClientCAFile); err != nil {
			return err
		}
	}
	cfg, err := a.tls.config("admission", a.admissionServing, clientCA)
	if err != nil {
		return err
	}
	h, err := authz.NewHandler(authz.HandlerOptions{
		Reviewer:     kube.AuthorizationV1().SubjectAccessReviews(),
		Verdicts:     verdicts,
		SecretRefs:   secretRefs,
		MaxBodyBytes: a.opts.AdmissionMaxBodyBytes,
		Auth:         auth,
		Route:        a.opts.ClusterName,
		Logger:       a.log,
		Metrics:      authz.NewMetrics(a.opts.Registry),
	})
	if err != nil {
		return err
	}
	a.candidates, err = admission.NewHandler(admission.HandlerOptions{
		Store:         a.store,
		Render:        declared.Manifest,
		SecretDigest:  a.secretDigest,
		Auth:          auth,
		MaxBodyBytes:  a.opts.AttributionMaxBodyBytes,
		InFlightBytes: a.opts.AttributionInFlightBytes,
		QueueBytes:    a.opts.AttributionQueueBytes,
		Losses:        a.reviewLosses,
		Logger:        a.log,
		Metrics:       admission.NewMetrics(a.opts.Registry),
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(authz.Path, h)
	mux.Handle(authz.Path+"/", h) // with a path token
	mux.Handle(authz.SecretRefsPath, h)
	mux.Handle(authz.SecretRefsPath+"/", h)
	mux.Handle(admission.PathPrefix, a.candidates)
	a.admissionSrv = newServer(mux, a.log)
	a.admissionSrv.TLSConfig = cfg
	a.admissionLn, err = a.listen("admission", a.opts.AdmissionListenAddress)
	return err
}

// admissionAuth binds the admission listener's credentials to routes and webhooks: verified
// client certificates by common name, and the secrets of --admission-token-file (the webhook
// tokens derived from them, reviewhttp.WebhookToken).
func (a *App) admissionAuth() (*reviewhttp.Auth, error) {
	auth := &reviewhttp.Auth{
		Callers:              audit.Authenticator{LocalRoute: a.opts.ClusterName, CertRoutes: a.opts.AdmissionClientCertRoutes},
		CertWebhooks:         a.opts.AdmissionClientCertWebhooks,
		AllowUnauthenticated: a.opts.AdmissionInsecureAllowUnauthenticated,
		Metrics:              reviewhttp.NewAuthMetrics(a.opts.Registry),
	}
	if f := a.opts.AdmissionTokenFile; f != "" {
		var err error
		if auth.Callers.Tokens, err = audit.LoadTokenFile("admission token file", f, a.opts.ClusterName); err != nil {
			return nil, err
		}
		if err := reviewhttp.ValidatePathTokens(f, auth.Callers.Tokens); err != nil {
			return nil, err
		}
	}
	if auth.AllowUnauthenticated {
		a.log.Warn("UNSAFE: the admission webhooks accept callers without credentials (--admission-insecure-allow-unauthenticated): "+
			"anyone who reaches the admission port can record CommitRequest verdicts and attribution candidates for route "+a.opts.ClusterName,
			"component", "authz")
	}
	return auth, nil
}

// listen binds a listener and registers its close; once a server serves it, the server's
// shutdown has closed it already.
func (a *App) listen(name, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w", name, err)
	}
	a.life.onStop(name+" listener", func(context.Context) error {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	})
	return ln, nil
}

// AuditAddr and OpsAddr are the bound addresses (useful with port 0).
func (a *App) AuditAddr() net.Addr { return a.auditLn.Addr() }
func (a *App) OpsAddr() net.Addr   { return a.opsLn.Addr() }

// AdmissionAddr and MetricsAddr are the admission and metrics listeners' bound addresses; nil
// when disabled.
func (a *App) AdmissionAddr() net.Addr { return addrOf(a.admissionLn) }
func (a *App) MetricsAddr() net.Addr   { return addrOf(a.metricsLn) }

func addrOf(ln net.Listener) net.Addr {
	if ln == nil {
		return nil
	}
	return ln.Addr()
}

// addrString is addr as a string, "" for nil (a disabled listener).
func addrString(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	return addr.String()
}

func newServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		HTTP2:             &http.HTTP2Config{MaxReadFrameSize: http2ReadFrameSize},
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// auditSecurity builds the audit listener's TLS (its serving certificate and client CA) and
// loads the bearer tokens, and binds each credential to its routes.
func (a *App) auditSecurity() (*tls.Config, audit.Authenticator, error) {
	var authn audit.Authenticator
	// A client certificate, when given, must verify; a request without one may still carry a
	// token.
	var clientCA dynamiccertificates.CAContentProvider
	var err error
	if a.opts.AuditClientCAFile != "" {
		if clientCA, err = a.tls.clientCAFile("audit", a.opts.AuditClientCAFile); err != nil {
			return nil, authn, err
		}
	}
	cfg, err := a.tls.config("audit", a.serving, clientCA)
	if err != nil {
		return nil, authn, err
	}
	authn.LocalRoute, authn.CertRoutes = a.opts.ClusterName, a.opts.AuditClientCertRoutes
	if a.opts.AuditTokenFile != "" {
		if authn.TokenFile, err = audit.OpenTokenFile("audit token file", a.opts.AuditTokenFile, a.opts.ClusterName); err != nil {
			return nil, authn, err
		}
		a.auditTokens = authn.TokenFile
	}
	return cfg, authn, nil
}

// tokenFileCheckInterval is how often the audit token file is read again.
var tokenFileCheckInterval = 10 * time.Second

// followTokenFile reads f again every tokenFileCheckInterval until ctx ends, and logs what
// changed: the number of tokens, or why a changed file does not load (never a token).
func followTokenFile(ctx context.Context, f *audit.TokenFile, log *slog.Logger) {
	wait.UntilWithContext(ctx, func(context.Context) {
		changed, err := f.Reload()
		switch {
		case err != nil:
			log.Error("the changed token file does not load; the previous tokens stay in force", "file", f.Path(), "err", err)
		case changed:
			log.Info("token file reloaded", "file", f.Path(), "tokens", len(f.Tokens()))
		}
	}, tokenFileCheckInterval)
}

func (a *App) restConfig() (*rest.Config, error) {
	if a.opts.RestConfig != nil {
		return rest.CopyConfig(a.opts.RestConfig), nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = a.opts.Kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubescribe"
	return cfg, nil
}

func (a *App) opsHandler() http.Handler {
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.readiness(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return r
}

// readiness is ready only while running, Redis answers and the controller caches synced. Its
// error is /readyz's body, which anyone who reaches the ops port reads: it says what is not
// ready, never an address or a server's message.
func (a *App) readiness(ctx context.Context) error {
	if !a.ready.Load() {
		return errors.New("not running (starting or shutting down)")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := a.store.Ping(ctx); err != nil {
		// The error names Redis' address and may quote its reply: it goes to the log only
		// (once per probe, every 10s with deploy/base/deployment.yaml).
		a.log.Warn("not ready: Redis does not answer PING", "component", "redis", "err", err)
		return errors.New("redis: not answering")
	}
	if !a.controller.Synced() {
		return errors.New("controller caches not synced")
	}
	return nil
}

// Run serves until ctx ends, then shuts down in the order that loses nothing. Each part
// registers its stop as it starts, so the shutdown is their reverse: stop the controller and
// the watches (no new change enters), let pending changes find their authors while the audit
// endpoint still receives facts, stop the audit endpoint, let the git workers commit and push,
// stop the ops endpoint and close Redis last. The whole shutdown is bounded by ShutdownTimeout.
func (a *App) Run(ctx context.Context) error {
	// Parts that must outlive ctx until their turn in the shutdown run under bg.
	bg := context.WithoutCancel(ctx)
	// Certificates and client CAs are followed from the start, and until the servers stopped.
	a.tls.Run()
	a.life.onStop("tls", a.tls.Stop)
	if a.selfTLS != nil {
		selfCtx, stopSelf := context.WithCancel(bg)
		selfDone := make(chan struct{})
		go func() { defer close(selfDone); a.selfTLS.Run(selfCtx) }()
		a.life.onStop("self-managed TLS", func(context.Context) error { stopSelf(); <-selfDone; return nil })
	}
	if a.auditTokens != nil {
		tokensCtx, stopTokens := context.WithCancel(bg)
		tokensDone := make(chan struct{})
		go func() {
			defer close(tokensDone)
			followTokenFile(tokensCtx, a.auditTokens, a.log.With("component", "audit"))
		}()
		a.life.onStop("audit token file", func(context.Context) error { stopTokens(); <-tokensDone; return nil })
	}
	serveErr := make(chan error, 4)
	a.serve("ops server", a.opsSrv, serveErr, func() error { return a.opsSrv.Serve(a.opsLn) })
	if a.metricsSrv != nil {
		a.serve("metrics server", a.metricsSrv, serveErr, func() error { return a.metricsSrv.ServeTLS(a.metricsLn, "", "") })
	}

	if a.membership != nil {
		// Left after the git workers pushed what they hold (a stop runs before those
		// registered earlier): the other replicas take this one's branches over then, at once.
		memberCtx, leave := context.WithCancel(bg)
		memberDone := make(chan struct{})
		go func() { defer close(memberDone); _ = a.membership.Run(memberCtx) }()
		a.life.onStop("replica membership", func(context.Context) error { leave(); <-memberDone; return nil })
	}
	a.router.Start(bg)
	a.life.onStop("git workers", a.router.Stop)

	joinCtx, stopJoin := context.WithCancel(bg)
	joinDone := make(chan struct{})
	go func() { defer close(joinDone); _ = a.joiner.Run(joinCtx) }()
	a.life.onStop("attribution", func(context.Context) error { stopJoin(); <-joinDone; return nil })

	a.serve("audit server", a.auditSrv, serveErr, func() error { return a.auditSrv.ServeTLS(a.auditLn, "", "") })
	if a.admissionSrv != nil {
		// The candidate writer stops after the server (which queues for it), before Redis.
		candCtx, stopCand := context.WithCancel(bg)
		candDone := make(chan struct{})
		go func() { defer close(candDone); a.candidates.Run(candCtx) }()
		a.life.onStop("admission candidates", func(context.Context) error { stopCand(); <-candDone; return nil })
		// It records verdicts in Redis, which closes after it stops.
		a.serve("admission server", a.admissionSrv, serveErr, func() error { return a.admissionSrv.ServeTLS(a.admissionLn, "", "") })
	}
	a.life.onStop("pending attributions", func(ctx context.Context) error {
		// Changes waiting for a fact the apiserver may still be retrying are left for the
		// next start (their cursors do not cover them); the others end within the grace.
		a.joiner.Abandon()
		return a.joiner.Wait(ctx)
	})

	a.sources.Start(bg)
	a.life.onStop("watches", func(context.Context) error { a.sources.Stop(); return nil })

	ctrlCtx, stopController := context.WithCancel(ctx)
	ctrlDone := make(chan struct{})
	var ctrlErr error
	go func() { defer close(ctrlDone); ctrlErr = a.controller.Run(ctrlCtx, a.opts.ControllerWorkers) }()
	var runErr error
	a.life.onStop("controller", func(context.Context) error {
		stopController()
		<-ctrlDone
		if runErr != nil {
			return nil // already reported as the reason of the shutdown
		}
		return ctrlErr
	})

	a.ready.Store(true)
	a.log.Info("kubescribe running", "audit", a.AuditAddr().String(), "ops", a.OpsAddr().String(),
		"metrics", addrString(a.MetricsAddr()), "admission", a.opts.AdmissionListenAddress != "", "attributionSource", a.opts.AttributionSource,
		"cluster", a.opts.ClusterName, "redis", a.opts.RedisAddr, "keyPrefix", a.opts.RedisKeyPrefix)

	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	case <-ctrlDone:
		runErr = ctrlErr
		if runErr == nil {
			runErr = errors.New("controller stopped unexpectedly")
		}
	}
	a.ready.Store(false)
	// The apiserver keeps its connections to the audit and admission endpoints open: each is
	// closed after its next answer from now on, so that the apiserver's next batch or review
	// opens a new one, which its Service sends to a replica that is still ready.
	a.auditSrv.SetKeepAlivesEnabled(false)
	if a.admissionSrv != nil {
		a.admissionSrv.SetKeepAlivesEnabled(false)
	}
	// The endpoints keep serving for ShutdownDelay (their stops wait for it), until the
	// Services' change reached every kube-proxy; a batch sent here meanwhile, or just after, may
	// still fail: the changes it explains wait for the apiserver's retry, in every replica.
	a.stopping = time.Now()
	a.deliveries.Draining(a.stopping.Add(a.opts.ShutdownDelay+audit.DeliverySlack), a.opts.ClusterName)
	a.log.Info("shutting down", "timeout", a.opts.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(bg, a.opts.ShutdownTimeout)
	defer cancel()
	err := a.life.stop(sctx)
	if runErr != nil {
		err = errors.Join(runErr, err)
	}
	if err != nil {
		a.log.Error("stopped with errors", "err", err)
	} else {
		a.log.Info("stopped")
	}
	return err
}

// serve runs srv in the background and registers its graceful shutdown. A serving error other
// than the shutdown itself is sent to errc.
func (a *App) serve(name string, srv *http.Server, errc chan<- error, f func() error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("%s: %w", name, err)
		}
	}()
	a.life.onStop(name, func(ctx context.Context) error {
		if srv == a.auditSrv || srv == a.admissionSrv {
			// Connections still arrive until the Pod's removal reached every kube-proxy.
			select {
			case <-time.After(time.Until(a.stopping.Add(a.opts.ShutdownDelay))):
			case <-ctx.Done():
			}
		}
		err := srv.Shutdown(ctx)
		<-done
		return err
	})
}

// attributionWebhook is how the controller manages the attribution webhook configuration; nil
// when it is not asked to.
func (a *App) attributionWebhook() (*controller.AttributionWebhookOptions, error) {
	o := a.opts
	if o.AttributionWebhookURL == "" && o.AttributionWebhookService == "" {
		return nil, nil
	}
	var ca []byte
	var caBundle func() []byte
	if a.selfTLS != nil {
		ca, caBundle = a.selfTLS.CABundle(), a.selfTLS.CABundle
	} else {
		var err error
		if ca, err = os.ReadFile(o.AttributionWebhookCAFile); err != nil {
			return nil, fmt.Errorf("reading the attribution webhook CA bundle: %w", err)
		}
	}
	cc, err := admission.ClientConfig(o.AttributionWebhookURL, o.AttributionWebhookService, ca, o.ClusterName)
	if err != nil {
		return nil, fmt.Errorf("attribution webhook: %w", err)
	}
	if o.AdmissionTokenFile != "" {
		// The apiserver authenticates with the attribution webhook's token (derived from the
		// first secret bound to this cluster), in the webhook's URL path (a managed cluster
		// presents no client certificate): it opens that webhook only.
		tokens, err := audit.LoadTokenFile("admission token file", o.AdmissionTokenFile, o.ClusterName)
		if err != nil {
			return nil, err
		}
		reviewhttp.AddPathToken(&cc, reviewhttp.PathTokenFor(tokens, o.ClusterName, reviewhttp.WebhookAttribution))
	}
	src, _ := attribution.ParseSource(o.AttributionSource) // validated
	return &controller.AttributionWebhookOptions{ClientConfig: cc, CABundle: caBundle, ExcludeNamespaces: o.AttributionWebhookExcludeNamespaces,
		Secrets: o.SecretDigestKey != nil, SecretsOnly: src == attribution.SourceAudit}, nil
}

// inClusterNamespaceFile holds the namespace of the Pod's ServiceAccount.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// newMembership builds this replica's membership: its name and the Leases' namespace from the
// options, else from the Pod (the Downward API's POD_NAME and POD_NAMESPACE, the
// ServiceAccount's namespace), else the host name and "kubescribe".
func (a *App) newMembership(kube kubernetes.Interface) (*ownership.Membership, error) {
	o := a.opts
	name := cmp.Or(o.ReplicaName, os.Getenv("POD_NAME"))
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("naming this replica (--replica-name): %w", err)
		}
		name = strings.ToLower(host)
	}
	ns := cmp.Or(o.CoordinationNamespace, os.Getenv("POD_NAMESPACE"))
	if ns == "" {
		if b, err := os.ReadFile(inClusterNamespaceFile); err == nil {
			ns = strings.TrimSpace(string(b))
		}
	}
	ns = cmp.Or(ns, "kubescribe")
	return ownership.New(ownership.Options{
		Client: kube, Namespace: ns, Identity: name,
		LeaseDuration: o.LeaseDuration, RenewDeadline: o.LeaseRenewDeadline, RenewInterval: o.LeaseRenewInterval,
		Logger: a.log, Registerer: o.Registry,
	})
}
