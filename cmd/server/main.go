// Command server runs kubescribe: it receives the kube-apiserver's audit events, watches the
// objects WatchRules select and commits their changes to Git under their authors' names.
// Flags are documented in docs/configuration.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/kubescribe/kubescribe/internal/app"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

func main() { os.Exit(run(os.Args[1:])) }

// defaultGCPercent replaces Go's GOGC default of 100 unless GOGC is set. Most of kubescribe's
// heap is long-lived (the informers' compact objects); at 100 the heap grows to twice that
// before a collection, at 50 to one and a half times, for more frequent collections
// (docs/operations.md, "Memory").
const defaultGCPercent = 50

func run(args []string) int {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	opts, logger, err := parseFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubescribe:", err)
		return 2
	}
	opts.Logger = logger
	installRedisLogger(logger)
	installKlogLogger(logger)
	a, err := app.New(opts)
	if err != nil {
		logger.Error("cannot start", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process at once
	}()
	go releaseAfterBursts(ctx, logger)
	if err := a.Run(ctx); err != nil {
		return 1
	}
	return 0
}

func parseFlags(args []string) (app.Options, *slog.Logger, error) {
	opts := app.DefaultOptions()
	fs := flag.NewFlagSet("kubescribe", flag.ContinueOnError)
	fs.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses $KUBECONFIG or ~/.kube/config when present, else the in-cluster config")
	fs.StringVar(&opts.ClusterName, "cluster-name", opts.ClusterName, "audit route of the cluster kubescribe runs in (its apiserver posts to /audit/<name>)")
	fs.StringVar(&opts.RedisAddr, "redis-addr", "", "Redis host:port (required); a comma-separated list names the Sentinels (with --redis-master-name) or the seed nodes of a Redis Cluster")
	fs.StringVar(&opts.RedisMasterName, "redis-master-name", "", "use Redis Sentinel: the name of the master the Sentinels at --redis-addr watch")
	fs.BoolVar(&opts.RedisCluster, "redis-cluster", false, "use Redis Cluster even with a single --redis-addr (a configuration endpoint)")
	fs.StringVar(&opts.RedisUsername, "redis-username", "", "Redis ACL user; empty uses the default user")
	redisPasswordFile := fs.String("redis-password-file", "", "file holding the Redis password (else $REDIS_PASSWORD)")
	fs.StringVar(&opts.RedisSentinelUsername, "redis-sentinel-username", "", "ACL user kubescribe authenticates to the Redis Sentinels as; empty uses their default user")
	redisSentinelPasswordFile := fs.String("redis-sentinel-password-file", "", "file holding the password of the Redis Sentinels (their requirepass); required with --redis-master-name unless the Sentinels are reached over TLS with --redis-ca-file or --redis-server-name. A Sentinel that answers without authentication is then refused")
	fs.BoolVar(&opts.RedisSentinelInsecureAllowUnauthenticated, "redis-sentinel-insecure-allow-unauthenticated", false, "UNSAFE: use Redis Sentinels without authentication and without pinned TLS; whoever reaches a Sentinel can re-point it at their own listener, which then receives the Redis password")
	secretDigestKeyFile := fs.String("secret-digest-key-file", "", "file holding the key (at least 32 bytes, e.g. openssl rand -hex 32; the same on every replica) of the digests the admission tier keeps of Secrets' writes, to credit encrypted Secrets to their authors; without it their creates and updates are unresolved")
	fs.IntVar(&opts.RedisDB, "redis-db", 0, "Redis database number")
	fs.BoolVar(&opts.RedisTLS, "redis-tls", false, "connect to Redis and its Sentinels over TLS, verifying their certificate against the system roots or --redis-ca-file (the --redis-ca-file, --redis-cert-file and --redis-server-name flags turn it on too)")
	fs.StringVar(&opts.RedisCAFile, "redis-ca-file", "", "PEM CA bundle verifying Redis' certificate, reloaded when it changes")
	fs.StringVar(&opts.RedisCertFile, "redis-cert-file", "", "PEM client certificate presented to Redis (tls-auth-clients), reloaded when it changes; with --redis-key-file")
	fs.StringVar(&opts.RedisKeyFile, "redis-key-file", "", "PEM private key of --redis-cert-file")
	fs.StringVar(&opts.RedisServerName, "redis-server-name", "", "name Redis' certificate must carry; empty uses the host of each address dialled")
	fs.StringVar(&opts.RedisKeyPrefix, "redis-key-prefix", opts.RedisKeyPrefix, "prefix of every Redis key; no glob characters or '%', trailing ':' trimmed")
	fs.StringVar(&opts.AuditListenAddress, "audit-listen-address", opts.AuditListenAddress, "address of the TLS audit endpoint")
	fs.StringVar(&opts.OpsListenAddress, "ops-listen-address", opts.OpsListenAddress, "address of /healthz and /readyz (plain HTTP, no authentication: for kubelet probes)")
	fs.StringVar(&opts.MetricsListenAddress, "metrics-listen-address", opts.MetricsListenAddress, "address of /metrics, over TLS with the admission serving certificate; each caller's bearer token is checked with a TokenReview and its user with a SubjectAccessReview (get on /metrics); empty disables it")
	fs.BoolVar(&opts.MetricsInsecureAllowUnauthenticated, "metrics-insecure-allow-unauthenticated", false, "UNSAFE: serve /metrics (still over TLS) without authentication or authorization, to anyone who reaches the metrics port; for a port a NetworkPolicy or an authenticating proxy guards")
	fs.StringVar(&opts.TLSCertFile, "tls-cert-file", "", "PEM serving certificate of the audit endpoint (required without --tls-self-managed-secret), reloaded when it changes")
	fs.StringVar(&opts.TLSKeyFile, "tls-private-key-file", "", "PEM private key of the audit endpoint (required)")
	fs.StringVar(&opts.TLSSelfManagedSecret, "tls-self-managed-secret", "", "namespace/name: kubescribe mints its own CA and serving certificate into this Secret (created if absent), renews them and serves them on every listener, instead of --tls-cert-file and --admission-tls-cert-file")
	selfServices := fs.String("tls-self-managed-services", strings.Join(opts.TLSSelfManagedServices, ","), "comma-separated Services, in the self-managed Secret's namespace, whose names (<service>.<namespace>.svc[.cluster.local]) the self-managed certificate carries")
	selfSANs := fs.String("tls-self-managed-extra-sans", "", "comma-separated DNS names and IP addresses the self-managed certificate carries besides the Services' names (the address an apiserver dials, say)")
	fs.DurationVar(&opts.TLSSelfManagedValidity, "tls-self-managed-validity", opts.TLSSelfManagedValidity, "life of the self-managed serving certificate, renewed at 2/3 of it")
	fs.DurationVar(&opts.TLSSelfManagedCAValidity, "tls-self-managed-ca-validity", opts.TLSSelfManagedCAValidity, "life of the self-managed CA (at least three times --tls-self-managed-validity); its successor joins the CA bundle at 2/3 of it")
	selfWebhooks := fs.String("tls-self-managed-webhooks", strings.Join(opts.TLSSelfManagedWebhooks, ","), "comma-separated ValidatingWebhookConfigurations whose caBundle kubescribe keeps equal to its self-managed CA bundle")
	fs.DurationVar(&opts.TLSSelfManagedCheckInterval, "tls-self-managed-check-interval", opts.TLSSelfManagedCheckInterval, "how often the self-managed Secret and webhook configurations are read again when no renewal is due sooner")
	fs.StringVar(&opts.AuditClientCAFile, "audit-client-ca-file", "", "PEM CA bundle verifying apiserver client certificates, reloaded when it changes")
	fs.StringVar(&opts.AuditTokenFile, "audit-token-file", "", "file of accepted bearer tokens, one `<token> [<route>,...]` per line; a token without routes may post to --cluster-name only")
	var auditCertRoutes, admissionCertRoutes stringList
	fs.Var(&auditCertRoutes, "audit-client-cert-routes", "bind a verified audit client certificate to routes: <common name>=<route>[,<route>...]; repeat it. A verified certificate not listed may post to --cluster-name only")
	fs.Int64Var(&opts.AuditMaxBodyBytes, "audit-max-body-bytes", opts.AuditMaxBodyBytes, "largest audit batch accepted; larger ones are answered 413")
	fs.StringVar(&opts.AdmissionListenAddress, "admission-listen-address", opts.AdmissionListenAddress, "address of the TLS admission webhooks (POST /validate/commitrequests and /validate/attribution/{route}); empty disables them")
	fs.StringVar(&opts.AdmissionTLSCertFile, "admission-tls-cert-file", "", "PEM serving certificate of the admission webhook, reloaded when it changes; empty uses --tls-cert-file")
	fs.StringVar(&opts.AdmissionTLSKeyFile, "admission-tls-private-key-file", "", "PEM private key of the admission webhook; empty uses --tls-private-key-file")
	fs.StringVar(&opts.AdmissionClientCAFile, "admission-client-ca-file", "", "PEM CA bundle verifying the client certificate the apiserver presents to the admission webhooks (its AdmissionConfiguration), reloaded when it changes; required with the admission listener unless --admission-token-file is set")
	var admissionCertWebhooks stringList
	fs.Var(&admissionCertWebhooks, "admission-client-cert-webhooks", "bind a verified admission client certificate to webhooks: <common name>=<webhook>[,<webhook>] with webhooks commitrequests and attribution; repeat it. A verified certificate not listed may call both")
	fs.Var(&admissionCertRoutes, "admission-client-cert-routes", "bind a verified admission client certificate to routes: <common name>=<route>[,<route>...]; repeat it. A verified certificate not listed is bound to --cluster-name only")
	fs.StringVar(&opts.AdmissionTokenFile, "admission-token-file", "", "file of tokens the admission webhooks accept in their URL path (/validate/.../<token>) or as a bearer token, one `<token> [<route>,...]` per line: for managed clusters whose apiserver presents no client certificate")
	fs.BoolVar(&opts.AdmissionInsecureAllowUnauthenticated, "admission-insecure-allow-unauthenticated", false, "UNSAFE: serve the admission webhooks to callers without any credential, as if they were the local cluster's apiserver; anyone who reaches the port can then record CommitRequest verdicts and attribution candidates")
	fs.Int64Var(&opts.AdmissionMaxBodyBytes, "admission-max-body-bytes", opts.AdmissionMaxBodyBytes, "largest AdmissionReview accepted; larger ones are answered 413")
	fs.DurationVar(&opts.VerdictTTL, "verdict-ttl", opts.VerdictTTL, "how long admission verdicts of CommitRequests are kept in Redis (longer than the 10m maximum close delay)")
	fs.DurationVar(&opts.CommitRequestTTL, "commit-request-ttl", opts.CommitRequestTTL, "how long a finished CommitRequest is kept before kubescribe deletes it; 0 keeps them")
	fs.DurationVar(&opts.DiscoveryRefresh, "discovery-refresh-interval", opts.DiscoveryRefresh, "how often each source cluster's API discovery is re-read when no CRD or APIService change triggered it sooner")
	fs.DurationVar(&opts.AttributionGrace, "attribution-grace", opts.AttributionGrace, "how long a change waits for the audit fact naming its author")
	fs.DurationVar(&opts.AttributionResumeGrace, "attribution-resume-grace", opts.AttributionResumeGrace,
		"how long a change waits for an audit fact the apiserver may still be retrying: one made while kubescribe was not running, or one whose audit batch may have failed (covers the apiserver's default audit webhook retries)")
	fs.DurationVar(&opts.FactTTL, "fact-ttl", opts.FactTTL, "how long attribution facts are kept in Redis")
	fs.StringVar(&opts.AttributionSource, "attribution-source", opts.AttributionSource, "where the local cluster's authors come from: audit, admission (the validating webhook POST /validate/attribution/<cluster-name>, confirmed by the watch) or both (an audit fact wins)")
	fs.StringVar(&opts.AttributionWebhookURL, "attribution-webhook-url", "", "when set, kubescribe manages the attribution ValidatingWebhookConfiguration and the apiserver reaches its admission listener at this https URL (a URL without a path gets /validate/attribution/<cluster-name>)")
	fs.StringVar(&opts.AttributionWebhookService, "attribution-webhook-service", "", "when set, kubescribe manages the attribution ValidatingWebhookConfiguration and the apiserver reaches it through this Service, namespace/name[:port] (port 9443 by default)")
	fs.StringVar(&opts.AttributionWebhookCAFile, "attribution-webhook-ca-file", "", "PEM CA bundle the apiserver verifies kubescribe's admission certificate with (required with --attribution-webhook-url or --attribution-webhook-service)")
	excludeNS := fs.String("attribution-webhook-exclude-namespaces", strings.Join(opts.AttributionWebhookExcludeNamespaces, ","), "comma-separated namespaces never sent to the attribution webhook, besides kube-system (kubescribe's own)")
	fs.DurationVar(&opts.CandidateTTL, "candidate-ttl", opts.CandidateTTL, "how long admission candidates are kept in Redis (longer than --attribution-grace)")
	fs.Int64Var(&opts.AttributionMaxBodyBytes, "attribution-review-max-body-bytes", opts.AttributionMaxBodyBytes, "largest review the attribution webhook accepts; larger ones are answered 413")
	fs.Int64Var(&opts.AttributionInFlightBytes, "attribution-review-inflight-bytes", opts.AttributionInFlightBytes, "bytes of attribution review bodies read and decoded at once (at least --attribution-review-max-body-bytes); past it a review is answered 429 with Retry-After")
	fs.Int64Var(&opts.AttributionQueueBytes, "attribution-candidate-queue-bytes", opts.AttributionQueueBytes, "size bound of the admission candidates waiting to be written to Redis; past it candidates are dropped and counted")
	fs.DurationVar(&opts.FactMaxDelay, "audit-fact-max-delay", opts.FactMaxDelay, "how old an audit event's stageTimestamp may be when its batch arrives: the apiserver audit webhook's longest delivery delay (280s for its default batch and retry settings); older facts are refused as evidence")
	fs.DurationVar(&opts.FactClockSkew, "audit-fact-clock-skew", opts.FactClockSkew, "clock-skew allowance between the apiserver and kubescribe, on both sides of the audit fact window")
	fs.DurationVar(&opts.ShutdownTimeout, "shutdown-timeout", opts.ShutdownTimeout, "bound of the graceful shutdown")
	fs.DurationVar(&opts.ShutdownDelay, "shutdown-delay", opts.ShutdownDelay, "how long the audit and admission endpoints keep serving after readiness turned off, from the start of a shutdown: until the Pod's removal from its Services reached every kube-proxy (below --shutdown-timeout)")
	fs.IntVar(&opts.ControllerWorkers, "controller-workers", opts.ControllerWorkers, "reconcile workers")
	fs.StringVar(&opts.Coordination, "coordination", opts.Coordination, "how replicas share the work: leases (each keeps a member Lease; each branch is written by one live replica, the singletons run on the leader) or none (this process writes every branch: run exactly one)")
	fs.StringVar(&opts.CoordinationNamespace, "coordination-namespace", "", "namespace of the Leases; empty: $POD_NAMESPACE, else the in-cluster ServiceAccount's, else kubescribe")
	fs.StringVar(&opts.ReplicaName, "replica-name", "", "this replica's name among the others (unique; its member Lease); empty: $POD_NAME, else the host name")
	fs.DurationVar(&opts.LeaseDuration, "lease-duration", opts.LeaseDuration, "how long a replica's Lease counts after its last renewal: a killed replica's branches move within it (whole seconds)")
	fs.DurationVar(&opts.LeaseRenewDeadline, "lease-renew-deadline", opts.LeaseRenewDeadline, "how long after its last renewal a replica that cannot renew stops writing (below --lease-duration)")
	fs.DurationVar(&opts.LeaseRenewInterval, "lease-renew-interval", opts.LeaseRenewInterval, "how often a replica renews its Leases (below --lease-renew-deadline)")
	fs.BoolVar(&opts.AllowRemoteKubeconfigExec, "allow-remote-kubeconfig-exec", false, "accept GitTarget kubeconfigs (spec.sourceCluster) that run an exec or auth-provider plugin inside kubescribe")
	fs.BoolVar(&opts.AllowRemoteKubeconfigInsecure, "allow-remote-kubeconfig-insecure", false, "accept GitTarget kubeconfigs with insecure-skip-tls-verify or a plain http:// server")
	fs.BoolVar(&opts.InsecureSkipSecretReferenceCheck, "insecure-skip-secret-reference-check", false, "UNSAFE: use the Secrets GitProviders and GitTargets name, and encrypt Secrets for GitTargets, without an admission record that someone who may read them created or changed the object; whoever may write those objects then has kubescribe use any Secret of their namespace")
	var routeNamespaces stringList
	fs.Var(&routeNamespaces, "audit-route-namespaces", "bind a remote cluster's audit route to the namespaces whose GitTargets may mirror it (spec.sourceCluster.auditRoute): <route>=<namespace>[,<namespace>...]; repeat it. A route not bound is refused to every GitTarget")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	if err := fs.Parse(args); err != nil {
		return opts, nil, err
	}
	opts.AttributionWebhookExcludeNamespaces = splitList(*excludeNS)
	opts.TLSSelfManagedServices, opts.TLSSelfManagedExtraSANs = splitList(*selfServices), splitList(*selfSANs)
	opts.TLSSelfManagedWebhooks = splitList(*selfWebhooks)
	if fs.NArg() > 0 {
		return opts, nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var err error
	if opts.AuditClientCertRoutes, err = audit.ParseCertRoutes("--audit-client-cert-routes", auditCertRoutes); err != nil {
		return opts, nil, err
	}
	if opts.AdmissionClientCertRoutes, err = audit.ParseCertRoutes("--admission-client-cert-routes", admissionCertRoutes); err != nil {
		return opts, nil, err
	}
	if opts.AdmissionClientCertWebhooks, err = reviewhttp.ParseCertWebhooks("--admission-client-cert-webhooks", admissionCertWebhooks); err != nil {
		return opts, nil, err
	}
	if opts.AuditRouteNamespaces, err = app.ParseRouteNamespaces("--audit-route-namespaces", routeNamespaces); err != nil {
		return opts, nil, err
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return opts, nil, fmt.Errorf("--log-level: %w", err)
	}
	hopts := &slog.HandlerOptions{Level: level}
	var logger *slog.Logger
	switch *logFormat {
	case "json":
		logger = slog.New(slog.NewJSONHandler(os.Stderr, hopts))
	case "text":
		logger = slog.New(slog.NewTextHandler(os.Stderr, hopts))
	default:
		return opts, nil, fmt.Errorf("--log-format must be json or text, got %q", *logFormat)
	}

	// The password is read into memory only; it never appears on the command line.
	opts.RedisPassword = os.Getenv("REDIS_PASSWORD")
	if *redisPasswordFile != "" {
		b, err := os.ReadFile(*redisPasswordFile)
		if err != nil {
			return opts, nil, fmt.Errorf("--redis-password-file: %w", err)
		}
		opts.RedisPassword = strings.TrimRight(string(b), "\r\n")
	}
	if *redisSentinelPasswordFile != "" {
		b, err := os.ReadFile(*redisSentinelPasswordFile)
		if err != nil {
			return opts, nil, fmt.Errorf("--redis-sentinel-password-file: %w", err)
		}
		opts.RedisSentinelPassword = strings.TrimRight(string(b), "\r\n")
	}
	if *secretDigestKeyFile != "" {
		b, err := os.ReadFile(*secretDigestKeyFile)
		if err != nil {
			return opts, nil, fmt.Errorf("--secret-digest-key-file: %w", err)
		}
		opts.SecretDigestKey = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	return opts, logger, nil
}

// splitList is the non-empty items of a comma-separated list, trimmed.
func splitList(s string) []string {
	var items []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// stringList collects a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }
