// Package app assembles kubescribe: it wires the audit endpoint, the attribution store and
// join, the CRD controller with its watches and git workers, and the ops endpoints, and runs
// them with an ordered shutdown. cmd/server is a thin wrapper around it; tests embed it.
package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/ownership"
	"github.com/kubescribe/kubescribe/internal/secretenc"
	"github.com/kubescribe/kubescribe/internal/selftls"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Coordination modes (Options.Coordination).
const (
	CoordinationLeases = "leases"
	CoordinationNone   = "none"
)

// Options configure kubescribe. Start from DefaultOptions.
type Options struct {
	// Kubeconfig is the path of a kubeconfig file. Empty: client-go's usual rules ($KUBECONFIG,
	// ~/.kube/config), falling back to the in-cluster config.
	Kubeconfig string
	// RestConfig, when set, is used instead of Kubeconfig (for embedding and tests).
	RestConfig *rest.Config
	// ClusterName is the audit route of the cluster kubescribe runs in: its apiserver posts
	// to /audit/<ClusterName>.
	ClusterName string

	// RedisAddr is host:port of Redis (required: attribution facts live there), or a
	// comma-separated list: the Sentinels with RedisMasterName, else the seed nodes of a Redis
	// Cluster.
	RedisAddr string
	// RedisMasterName selects Sentinel: the name of the master the Sentinels at RedisAddr
	// watch.
	RedisMasterName string
	// RedisCluster selects Redis Cluster with a single address (a configuration endpoint);
	// several addresses select it anyway.
	RedisCluster bool
	// RedisUsername is the ACL user (Redis 6+); empty uses the default user.
	RedisUsername string
	// RedisPassword is held in memory only, never logged.
	RedisPassword string
	// SecretDigestKey keys the digests kept of Secrets' writes (secretenc.Digester; at least
	// 32 bytes, the same on every replica); nil: encrypted Secrets' creates and updates are
	// unresolved. Held in memory only, never logged.
	SecretDigestKey []byte
	RedisDB         int
	// RedisKeyPrefix is the prefix of every key (validated by keyspace.Parse).
	RedisKeyPrefix string
	// RedisTLS connects to Redis (and its Sentinels) over TLS, verifying its certificate
	// against the system roots or RedisCAFile. Any of the four below turns it on too.
	RedisTLS bool
	// RedisCAFile is a PEM CA bundle verifying Redis' certificate, reloaded when it changes.
	RedisCAFile string
	// RedisCertFile and RedisKeyFile are the client certificate and key kubescribe presents
	// (Redis' tls-auth-clients), reloaded when they change: both or neither.
	RedisCertFile, RedisKeyFile string
	// RedisServerName is the name Redis' certificate must carry; empty uses the host of each
	// address dialled (a Sentinel's, the master's it announces).
	RedisServerName string
	// RedisSentinelUsername and RedisSentinelPassword authenticate kubescribe to the
	// Sentinels (their requirepass, or an ACL user), apart from RedisUsername and
	// RedisPassword, which go to the master only. The password is held in memory only, never
	// logged. With it, a Sentinel that answers a command without authentication is refused
	// (anyone who reaches it could re-point it).
	RedisSentinelUsername, RedisSentinelPassword string
	// RedisSentinelInsecureAllowUnauthenticated accepts Sentinel mode with neither
	// RedisSentinelPassword nor a pinned TLS trust (RedisCAFile or RedisServerName): whoever
	// reaches a Sentinel can then re-point it at a listener of theirs, which receives
	// RedisPassword.
	RedisSentinelInsecureAllowUnauthenticated bool

	// AuditListenAddress serves POST /audit/{route} over TLS.
	AuditListenAddress string
	// OpsListenAddress serves /healthz and /readyz over plain HTTP, without authentication
	// (kubelet probes present no credential).
	OpsListenAddress string
	// MetricsListenAddress serves /metrics over TLS, with the admission listener's serving
	// certificate; empty disables it. Every request is authenticated with a TokenReview and
	// authorized with a SubjectAccessReview (non-resource URL /metrics, verb get) against the
	// Kubernetes API, unless MetricsInsecureAllowUnauthenticated.
	MetricsListenAddress string
	// MetricsInsecureAllowUnauthenticated serves /metrics without authentication or
	// authorization (still over TLS): for a listener a sidecar or a NetworkPolicy guards.
	MetricsInsecureAllowUnauthenticated bool
	// TLSCertFile and TLSKeyFile are the audit listener's serving certificate (PEM), reloaded
	// when the files change.
	TLSCertFile, TLSKeyFile string
	// TLSSelfManagedSecret, "namespace/name", makes kubescribe mint its own CA and serving
	// certificate into that Secret, renew them and serve them on every listener
	// (internal/selftls), instead of TLSCertFile and the admission certificate files, which
	// must then be empty.
	TLSSelfManagedSecret string
	// TLSSelfManagedServices are the Services, in the Secret's namespace, whose names
	// (<service>.<namespace>.svc and .svc.cluster.local) the self-managed certificate carries;
	// TLSSelfManagedExtraSANs are more DNS names and IP addresses it carries (the address an
	// apiserver dials the audit endpoint at, for example).
	TLSSelfManagedServices, TLSSelfManagedExtraSANs []string
	// TLSSelfManagedValidity and TLSSelfManagedCAValidity are the lives of the self-managed
	// serving certificate and CA, each renewed at 2/3 of it.
	TLSSelfManagedValidity, TLSSelfManagedCAValidity time.Duration
	// TLSSelfManagedWebhooks are the ValidatingWebhookConfigurations whose caBundle kubescribe
	// keeps equal to its self-managed CA bundle (the attribution webhook it manages follows it
	// anyway).
	TLSSelfManagedWebhooks []string
	// TLSSelfManagedCheckInterval is how often the Secret and those configurations are read
	// again when no renewal is due sooner.
	TLSSelfManagedCheckInterval time.Duration
	// AuditClientCAFile verifies client certificates of apiservers (optional); reloaded when
	// it changes.
	AuditClientCAFile string
	// AuditClientCertRoutes binds verified audit client certificates, by Subject common name,
	// to the routes they may post to; a verified certificate not listed may post to
	// ClusterName only.
	AuditClientCertRoutes map[string][]string
	// AuditTokenFile holds accepted bearer tokens, one `<token> [<route>,...]` per line
	// (optional; a token without routes is bound to ClusterName). At least one of
	// AuditClientCAFile and AuditTokenFile is required.
	AuditTokenFile string
	// AuditMaxBodyBytes limits one audit batch.
	AuditMaxBodyBytes int64

	// AdmissionListenAddress serves POST /validate/commitrequests over TLS; empty disables the
	// admission webhook (CommitRequests then have no admission record: SubmitterUnknown).
	AdmissionListenAddress string
	// AdmissionTLSCertFile and AdmissionTLSKeyFile are the serving certificate (PEM) of the
	// admission and metrics listeners, reloaded when the files change; empty uses
	// TLSCertFile/TLSKeyFile.
	AdmissionTLSCertFile, AdmissionTLSKeyFile string
	// AdmissionClientCAFile verifies the client certificate the apiserver presents to the
	// admission webhooks (configured in its AdmissionConfiguration); reloaded when it changes.
	// With the admission
	// listener, it or AdmissionTokenFile is required, unless
	// AdmissionInsecureAllowUnauthenticated.
	AdmissionClientCAFile string
	// AdmissionClientCertRoutes binds verified admission client certificates, by Subject
	// common name, to routes; a verified certificate not listed is bound to ClusterName only.
	AdmissionClientCertRoutes map[string][]string
	// AdmissionClientCertWebhooks binds verified admission client certificates, by Subject
	// common name, to the webhooks (commitrequests, attribution) they may call; a verified
	// certificate not listed may call both.
	AdmissionClientCertWebhooks map[string][]string
	// AdmissionTokenFile holds the tokens the admission webhooks accept in their URL path or as
	// a bearer token, one `<token> [<route>,...]` per line: for managed clusters, whose
	// apiserver presents no client certificate. Tokens may hold only URL-safe characters.
	AdmissionTokenFile string
	// AdmissionInsecureAllowUnauthenticated serves callers without any credential as if they
	// were the local cluster's apiserver. Unsafe: anyone who reaches the port can record
	// verdicts and candidates.
	AdmissionInsecureAllowUnauthenticated bool
	// AdmissionMaxBodyBytes limits one AdmissionReview.
	AdmissionMaxBodyBytes int64
	// VerdictTTL is how long admission verdicts are kept in Redis; it must outlive the longest
	// close delay of a CommitRequest.
	VerdictTTL time.Duration
	// CommitRequestTTL is how long a finished CommitRequest is kept before it is deleted; 0
	// keeps them.
	CommitRequestTTL time.Duration

	// AttributionGrace is how long a change waits for the audit fact naming its author.
	AttributionGrace time.Duration
	// AttributionResumeGrace is how long a change waits for an audit fact the apiserver may
	// still be retrying: one made while nothing watched, or a live one whose audit batch may
	// have failed (attribution.DefaultResumeGrace).
	AttributionResumeGrace time.Duration
	// AttributionSource is where the authors of the local cluster's changes come from: audit,
	// admission (candidates from POST /validate/attribution/{ClusterName}, confirmed by the
	// watch) or both (an audit fact wins).
	AttributionSource string
	// CandidateTTL is how long admission candidates are kept in Redis.
	CandidateTTL time.Duration
	// AttributionMaxBodyBytes limits one review to the attribution webhook;
	// AttributionInFlightBytes bounds the review bodies read and decoded at once (at least
	// AttributionMaxBodyBytes); AttributionQueueBytes bounds the candidates waiting to be
	// written to Redis, by size.
	AttributionMaxBodyBytes, AttributionInFlightBytes, AttributionQueueBytes int64
	// FactMaxDelay is how old an audit fact's stage timestamp may be when it arrives (the
	// apiserver's longest delivery delay); FactClockSkew is the clock-skew allowance added on
	// both sides. A fact outside that window is refused as evidence.
	FactMaxDelay, FactClockSkew time.Duration
	// AttributionWebhookURL or AttributionWebhookService (namespace/name[:port]), when one is
	// set, make kubescribe manage the attribution ValidatingWebhookConfiguration, its rules
	// following the watch rules in force; AttributionWebhookCAFile is then the CA bundle the
	// apiserver verifies kubescribe's admission certificate with (with TLSSelfManagedSecret,
	// the self-managed CA bundle instead).
	AttributionWebhookURL, AttributionWebhookService, AttributionWebhookCAFile string
	// AttributionWebhookExcludeNamespaces are never sent to the webhook (with kube-system):
	// kubescribe's own namespace.
	AttributionWebhookExcludeNamespaces []string
	// FactTTL is how long facts are kept in Redis.
	FactTTL time.Duration
	// ShutdownTimeout bounds the whole graceful shutdown.
	ShutdownTimeout time.Duration
	// ShutdownDelay is how long the audit and admission endpoints keep serving after readiness
	// turned off, counted from the start of the shutdown: until the Pod's removal from its
	// Services' endpoints reached every node's kube-proxy, connections still arrive. Below
	// ShutdownTimeout; 0 stops them as soon as their turn comes.
	ShutdownDelay time.Duration
	// DiscoveryRefresh is how often each source cluster's discovery catalog is re-read when
	// no CRD or APIService change triggered it sooner.
	DiscoveryRefresh time.Duration
	// ControllerWorkers is the number of reconcile workers.
	ControllerWorkers int

	// Coordination is how replicas share the work: CoordinationLeases (each replica keeps a
	// member Lease; the branches are shared among the live ones, internal/ownership) or
	// CoordinationNone (this process writes every branch and runs every singleton: run exactly
	// one).
	Coordination string
	// CoordinationNamespace holds the Leases; empty: $POD_NAMESPACE, else the namespace of the
	// in-cluster ServiceAccount, else "kubescribe".
	CoordinationNamespace string
	// ReplicaName names this replica among the others (its member Lease); empty: $POD_NAME,
	// else the host name. Unique among the replicas.
	ReplicaName string
	// LeaseDuration, LeaseRenewDeadline and LeaseRenewInterval time the Leases (ownership).
	LeaseDuration, LeaseRenewDeadline, LeaseRenewInterval time.Duration
	// AllowRemoteKubeconfigExec accepts GitTarget kubeconfigs (spec.sourceCluster) that run an
	// exec or auth-provider plugin; refused by default.
	AllowRemoteKubeconfigExec bool
	// AllowRemoteKubeconfigInsecure accepts GitTarget kubeconfigs with insecure-skip-tls-verify
	// or an http:// server; refused by default.
	AllowRemoteKubeconfigInsecure bool
	// AuditRouteNamespaces binds each remote cluster's audit route to the namespaces whose
	// GitTargets may mirror it (spec.sourceCluster.auditRoute). A route not listed is refused
	// to every GitTarget. Parsed by ParseRouteNamespaces.
	AuditRouteNamespaces map[string][]string
	// InsecureSkipSecretReferenceCheck has the controller use the Secrets GitProviders and
	// GitTargets name (and encrypt Secrets for GitTargets) without an admission record that
	// someone who may read them vouched for the spec. Unsafe: for a single-tenant cluster
	// without the admission webhook.
	InsecureSkipSecretReferenceCheck bool

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registry receives every metric and is what /metrics serves; a new one by default.
	Registry *prometheus.Registry
}

// DefaultOptions returns the defaults documented in docs/configuration.md.
func DefaultOptions() Options {
	return Options{
		ClusterName:          "local",
		RedisKeyPrefix:       keyspace.DefaultPrefix,
		AuditListenAddress:   ":8443",
		OpsListenAddress:     ":8080",
		MetricsListenAddress: ":8081",
		AuditMaxBodyBytes:    audit.DefaultMaxBodyBytes,

		AdmissionListenAddress: ":9443",
		AdmissionMaxBodyBytes:  authz.DefaultMaxBodyBytes,
		VerdictTTL:             authz.DefaultVerdictTTL,
		CommitRequestTTL:       24 * time.Hour,

		AttributionGrace: attribution.DefaultGrace,

		AttributionResumeGrace: attribution.DefaultResumeGrace,
		AttributionSource:      string(attribution.SourceAudit),
		CandidateTTL:           attribution.DefaultCandidateTTL,

		AttributionMaxBodyBytes:  admission.DefaultMaxBodyBytes,
		AttributionInFlightBytes: admission.DefaultInFlightBytes,
		AttributionQueueBytes:    admission.DefaultQueueBytes,
		FactMaxDelay:             attribution.DefaultFactMaxDelay,
		FactClockSkew:            attribution.DefaultFactClockSkew,

		TLSSelfManagedServices:      []string{"kubescribe-audit", "kubescribe-admission", "kubescribe-metrics"},
		TLSSelfManagedValidity:      selftls.DefaultValidity,
		TLSSelfManagedCAValidity:    selftls.DefaultCAValidity,
		TLSSelfManagedWebhooks:      []string{authz.WebhookConfigurationName},
		TLSSelfManagedCheckInterval: selftls.DefaultCheckInterval,

		AttributionWebhookExcludeNamespaces: []string{"kubescribe"},
		DiscoveryRefresh:                    watch.DefaultDiscoveryRefresh,
		FactTTL:                             attribution.DefaultFactTTL,
		ShutdownTimeout:                     30 * time.Second,
		ShutdownDelay:                       5 * time.Second,
		ControllerWorkers:                   2,

		Coordination:       CoordinationLeases,
		LeaseDuration:      ownership.DefaultLeaseDuration,
		LeaseRenewDeadline: ownership.DefaultRenewDeadline,
		LeaseRenewInterval: ownership.DefaultRenewInterval,
	}
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("app: Options.%s %s", field, fmt.Sprintf(format, args...)))
	}
	if !audit.ValidRoute(o.ClusterName) {
		bad("ClusterName", "%q must be a DNS label (lower-case letters, digits and '-')", o.ClusterName)
	}
	if o.SecretDigestKey != nil && len(o.SecretDigestKey) < secretenc.MinDigestKeySize {
		bad("SecretDigestKey", "is %d bytes; it needs at least %d", len(o.SecretDigestKey), secretenc.MinDigestKeySize)
	}
	if o.ShutdownDelay < 0 || o.ShutdownDelay >= o.ShutdownTimeout {
		bad("ShutdownDelay", "%s must be at least 0 and below ShutdownTimeout (%s)", o.ShutdownDelay, o.ShutdownTimeout)
	}
	switch o.Coordination {
	case CoordinationLeases:
		if !(0 < o.LeaseRenewInterval && o.LeaseRenewInterval < o.LeaseRenewDeadline && o.LeaseRenewDeadline < o.LeaseDuration) {
			bad("LeaseDuration", "(%s), LeaseRenewDeadline (%s) and LeaseRenewInterval (%s) must be positive, the interval below the deadline below the duration",
				o.LeaseDuration, o.LeaseRenewDeadline, o.LeaseRenewInterval)
		}
		if o.LeaseDuration%time.Second != 0 {
			bad("LeaseDuration", "%s must be whole seconds (a Lease counts seconds)", o.LeaseDuration)
		}
	case CoordinationNone:
	default:
		bad("Coordination", "%q must be %q or %q", o.Coordination, CoordinationLeases, CoordinationNone)
	}
	if strings.Trim(o.RedisAddr, ", ") == "" {
		bad("RedisAddr", "is required: attribution facts are kept in Redis")
	}
	if _, err := keyspace.Parse(o.RedisKeyPrefix); err != nil {
		bad("RedisKeyPrefix", "is invalid: %v", err)
	}
	if o.RedisDB < 0 {
		bad("RedisDB", "must not be negative, got %d", o.RedisDB)
	}
	if o.RedisDB != 0 && (o.RedisCluster || strings.Contains(o.RedisAddr, ",") && o.RedisMasterName == "") {
		bad("RedisDB", "must be 0 with Redis Cluster, which has a single database")
	}
	if (o.RedisCertFile == "") != (o.RedisKeyFile == "") {
		bad("RedisCertFile/RedisKeyFile", "must be given together: a client certificate needs its key")
	}
	if o.RedisServerName != "" && strings.ContainsAny(o.RedisServerName, ":/ ") {
		bad("RedisServerName", "%q must be a host name or an IP address, without a port", o.RedisServerName)
	}
	o.validateSentinel(bad)
	if o.AuditListenAddress == "" || o.OpsListenAddress == "" {
		bad("AuditListenAddress/OpsListenAddress", "must be set")
	}
	if o.TLSSelfManagedSecret == "" && (o.TLSCertFile == "" || o.TLSKeyFile == "") {
		bad("TLSCertFile/TLSKeyFile", "are required, or TLSSelfManagedSecret: the audit endpoint is served over TLS only")
	}
	if o.TLSSelfManagedSecret != "" {
		o.validateSelfManaged(bad)
	}
	if o.AuditClientCAFile == "" && o.AuditTokenFile == "" {
		bad("AuditClientCAFile/AuditTokenFile", "at least one is required, or no apiserver could authenticate")
	}
	for cn, routes := range o.AuditClientCertRoutes {
		if len(routes) == 0 || slices.ContainsFunc(routes, func(r string) bool { return !audit.ValidRoute(r) }) {
			bad("AuditClientCertRoutes", "%q: want one or more routes, each a DNS label, got %q", cn, routes)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"AttributionGrace", o.AttributionGrace}, {"AttributionResumeGrace", o.AttributionResumeGrace}, {"FactTTL", o.FactTTL}, {"ShutdownTimeout", o.ShutdownTimeout}, {"DiscoveryRefresh", o.DiscoveryRefresh}} {
		if d.v <= 0 {
			bad(d.name, "must be positive, got %s", d.v)
		}
	}
	if o.AttributionResumeGrace > 0 && o.AttributionResumeGrace < o.AttributionGrace {
		bad("AttributionResumeGrace", "(%s) must not be shorter than AttributionGrace (%s)", o.AttributionResumeGrace, o.AttributionGrace)
	}
	if o.FactTTL > 0 && o.FactTTL < o.AttributionResumeGrace {
		bad("FactTTL", "(%s) must be longer than AttributionResumeGrace (%s): a fact must outlive the longest wait for it", o.FactTTL, o.AttributionResumeGrace)
	}
	if o.FactTTL > 0 && o.FactTTL < o.AttributionGrace {
		bad("FactTTL", "(%s) must be longer than AttributionGrace (%s)", o.FactTTL, o.AttributionGrace)
	}
	if o.AuditMaxBodyBytes <= 0 {
		bad("AuditMaxBodyBytes", "must be positive, got %d", o.AuditMaxBodyBytes)
	}
	if o.AdmissionMaxBodyBytes <= 0 {
		bad("AdmissionMaxBodyBytes", "must be positive, got %d", o.AdmissionMaxBodyBytes)
	}
	if minTTL := time.Duration(v1alpha1.MaxCloseDelaySeconds) * time.Second; o.VerdictTTL <= minTTL {
		bad("VerdictTTL", "(%s) must be longer than the longest close delay of a CommitRequest (%s)", o.VerdictTTL, minTTL)
	}
	if o.CommitRequestTTL < 0 {
		bad("CommitRequestTTL", "must not be negative, got %s", o.CommitRequestTTL)
	}
	if o.AdmissionListenAddress != "" && o.AdmissionClientCAFile == "" && o.AdmissionTokenFile == "" && !o.AdmissionInsecureAllowUnauthenticated {
		bad("AdmissionClientCAFile/AdmissionTokenFile", "one is required with the admission listener, or anyone who reaches it could record "+
			"CommitRequest verdicts and attribution candidates (--admission-insecure-allow-unauthenticated opts out, unsafely)")
	}
	for cn, routes := range o.AdmissionClientCertRoutes {
		if len(routes) == 0 || slices.ContainsFunc(routes, func(r string) bool { return !audit.ValidRoute(r) }) {
			bad("AdmissionClientCertRoutes", "%q: want one or more routes, each a DNS label, got %q", cn, routes)
		}
	}
	if (o.AdmissionTLSCertFile == "") != (o.AdmissionTLSKeyFile == "") {
		bad("AdmissionTLSCertFile/AdmissionTLSKeyFile", "must be set together")
	}
	if src, err := attribution.ParseSource(o.AttributionSource); err != nil {
		bad("AttributionSource", "is invalid: %v", err)
	} else if src != attribution.SourceAudit && o.AdmissionListenAddress == "" {
		bad("AttributionSource", "%q needs the admission listener (AdmissionListenAddress), which serves /validate/attribution/{route}", src)
	}
	if o.AttributionMaxBodyBytes <= 0 || o.AttributionInFlightBytes <= 0 || o.AttributionQueueBytes <= 0 {
		bad("AttributionMaxBodyBytes/AttributionInFlightBytes/AttributionQueueBytes", "must be positive, got %d, %d and %d",
			o.AttributionMaxBodyBytes, o.AttributionInFlightBytes, o.AttributionQueueBytes)
	} else if o.AttributionInFlightBytes < o.AttributionMaxBodyBytes {
		bad("AttributionInFlightBytes", "(%d) must hold one review of AttributionMaxBodyBytes (%d)", o.AttributionInFlightBytes, o.AttributionMaxBodyBytes)
	}
	if o.FactMaxDelay <= 0 || o.FactClockSkew <= 0 {
		bad("FactMaxDelay/FactClockSkew", "must be positive, got %s and %s", o.FactMaxDelay, o.FactClockSkew)
	}
	if o.CandidateTTL <= 0 {
		bad("CandidateTTL", "must be positive, got %s", o.CandidateTTL)
	} else if o.CandidateTTL < o.AttributionGrace {
		bad("CandidateTTL", "(%s) must be longer than AttributionGrace (%s)", o.CandidateTTL, o.AttributionGrace)
	}
	if o.AttributionWebhookURL != "" || o.AttributionWebhookService != "" {
		switch {
		case o.AttributionWebhookURL != "" && o.AttributionWebhookService != "":
			bad("AttributionWebhookURL/AttributionWebhookService", "are exclusive: the apiserver reaches kubescribe one way")
		case o.AttributionWebhookCAFile == "" && o.TLSSelfManagedSecret == "":
			bad("AttributionWebhookCAFile", "is required to manage the attribution webhook: the apiserver must verify kubescribe's certificate")
		case o.AdmissionListenAddress == "":
			bad("AttributionWebhookURL/AttributionWebhookService", "need the admission listener (AdmissionListenAddress)")
		}
		if src, err := attribution.ParseSource(o.AttributionSource); err == nil && src == attribution.SourceAudit && o.SecretDigestKey == nil {
			// The webhook then serves only what audit events cannot: Secrets' authors.
			bad("AttributionWebhookURL/AttributionWebhookService", "with AttributionSource audit serve only the writes of encrypted Secrets, which need SecretDigestKey: set it, or the source admission or both")
		}
	}
	o.validateRouteNamespaces(bad)
	if o.ControllerWorkers <= 0 {
		bad("ControllerWorkers", "must be positive, got %d", o.ControllerWorkers)
	}
	return errors.Join(errs...)
}

// SelfManagedSecret is TLSSelfManagedSecret's namespace and name.
func (o *Options) SelfManagedSecret() (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(o.TLSSelfManagedSecret, "/")
	if !ok || len(validation.IsDNS1123Label(namespace)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return "", "", fmt.Errorf("%q: want <namespace>/<name>", o.TLSSelfManagedSecret)
	}
	return namespace, name, nil
}

// SelfManagedPolicy is what the self-managed certificates must be: the Services' names in the
// Secret's namespace and the extra names and addresses.
func (o *Options) SelfManagedPolicy() (selftls.Policy, error) {
	namespace, _, err := o.SelfManagedSecret()
	if err != nil {
		return selftls.Policy{}, err
	}
	p := selftls.Policy{DNSNames: selftls.ServiceDNSNames(namespace, o.TLSSelfManagedServices...),
		Validity: o.TLSSelfManagedValidity, CAValidity: o.TLSSelfManagedCAValidity}
	for _, san := range o.TLSSelfManagedExtraSANs {
		if ip := net.ParseIP(san); ip != nil {
			p.IPs = append(p.IPs, ip)
		} else if len(validation.IsDNS1123Subdomain(san)) == 0 {
			p.DNSNames = append(p.DNSNames, san)
		} else {
			return p, fmt.Errorf("extra SAN %q is neither an IP address nor a DNS name", san)
		}
	}
	return p, p.Validate()
}

// validateSelfManaged reports what is wrong with the self-managed TLS options.
func (o *Options) validateSelfManaged(bad func(field, format string, args ...any)) {
	if o.TLSCertFile != "" || o.TLSKeyFile != "" || o.AdmissionTLSCertFile != "" || o.AdmissionTLSKeyFile != "" {
		bad("TLSSelfManagedSecret", "excludes TLSCertFile, TLSKeyFile, AdmissionTLSCertFile and AdmissionTLSKeyFile: the listeners serve the self-managed certificate")
	}
	if o.AttributionWebhookCAFile != "" {
		bad("TLSSelfManagedSecret", "excludes AttributionWebhookCAFile: the attribution webhook gets the self-managed CA bundle")
	}
	if _, err := o.SelfManagedPolicy(); err != nil {
		bad("TLSSelfManagedSecret", "%v", err)
	}
	for _, s := range o.TLSSelfManagedServices {
		if len(validation.IsDNS1123Label(s)) > 0 {
			bad("TLSSelfManagedServices", "%q is not a Service name", s)
		}
	}
	for _, w := range o.TLSSelfManagedWebhooks {
		if len(validation.IsDNS1123Subdomain(w)) > 0 {
			bad("TLSSelfManagedWebhooks", "%q is not a ValidatingWebhookConfiguration name", w)
		}
	}
	if o.TLSSelfManagedCheckInterval <= 0 {
		bad("TLSSelfManagedCheckInterval", "must be positive, got %s", o.TLSSelfManagedCheckInterval)
	}
}

// validateSentinel reports what is wrong with the Sentinel options: Sentinel mode needs the
// Sentinels' authentication, or a TLS trust an attacker cannot satisfy (a CA of one's own, or
// a pinned server name), or the loudly named opt-out. Otherwise whoever reaches a Sentinel can
// re-point it (SENTINEL REMOVE, MONITOR) at their own listener, which then receives
// RedisPassword.
func (o *Options) validateSentinel(bad func(field, format string, args ...any)) {
	if o.RedisMasterName == "" {
		if o.RedisSentinelUsername != "" || o.RedisSentinelPassword != "" || o.RedisSentinelInsecureAllowUnauthenticated {
			bad("RedisSentinelUsername/RedisSentinelPassword/RedisSentinelInsecureAllowUnauthenticated", "apply to Sentinel mode only (RedisMasterName)")
		}
		return
	}
	if o.RedisSentinelUsername != "" && o.RedisSentinelPassword == "" {
		bad("RedisSentinelUsername", "needs RedisSentinelPassword")
	}
	pinnedTLS := o.RedisTLSEnabled() && (o.RedisCAFile != "" || o.RedisServerName != "")
	if o.RedisSentinelPassword == "" && !pinnedTLS && !o.RedisSentinelInsecureAllowUnauthenticated {
		bad("RedisSentinelPassword", "is required with Sentinel (RedisMasterName), or TLS with RedisCAFile or RedisServerName: "+
			"whoever reaches an unauthenticated Sentinel can re-point it at their own listener, which then receives the Redis password "+
			"(--redis-sentinel-insecure-allow-unauthenticated opts out, unsafely)")
	}
}

// RedisTLSEnabled reports whether kubescribe talks TLS to Redis: RedisTLS or any of the files or
// the server name that only TLS uses.
func (o Options) RedisTLSEnabled() bool {
	return o.RedisTLS || o.RedisCAFile != "" || o.RedisCertFile != "" || o.RedisServerName != ""
}
