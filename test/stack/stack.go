// Package stack runs kubescribe end to end for the e2e tests and the demo: the real control
// plane of test/controlplane, kubescribe's CRDs and RBAC from deploy/ installed into it, and
// kubescribe itself in-process (through internal/app, as cmd/server runs it), authenticated as
// the token user "kubescribe" bound to deploy/base/rbac.yaml's ClusterRole, deploy/components/
// attribution-webhook/rbac.yaml's, and a test-only ClusterRole reading every resource.
package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/retry"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/app"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

// ShutdownDelay is kubescribe's --shutdown-delay in the stack: 1s, not the default 5s. No
// kube-proxy stands between the apiserver and kubescribe here; the balancers of StartReplicas
// see a replica's readiness turn off within 200ms, so a second covers them, and each of the
// many restarts of the e2e tests is 4s shorter. The real node (test/cluster) runs the
// Deployment's default behind kube-proxy.
const ShutdownDelay = time.Second

// Options configure Start.
type Options struct {
	// Dir holds everything; required.
	Dir string
	// Grace is kubescribe's attribution grace window; 0 keeps the default.
	Grace time.Duration
	// Logf receives progress messages; optional.
	Logf func(format string, args ...any)
	// KubescribeConfig, when set, turns the rest config kubescribe would use into the one it
	// uses: a test may put something between kubescribe and the apiserver.
	KubescribeConfig func(*rest.Config) (*rest.Config, error)
	// NoAuditWebhook starts the apiserver without an audit webhook (a managed cluster).
	NoAuditWebhook bool
	// RemoteRoutes are the routes of remote clusters the tests may start (StartRemote):
	// kubescribe binds their apiservers' audit client certificates to them.
	RemoteRoutes []string
	// AuditRouteNamespaces is kubescribe's --audit-route-namespaces: the namespaces whose
	// GitTargets may mirror each remote route. A route not listed is refused.
	AuditRouteNamespaces map[string][]string
	// AttributionSource is kubescribe's --attribution-source; "" keeps the default (audit).
	AttributionSource string
	// RedisTLS runs Redis on TLS only, requiring a client certificate, and kubescribe with
	// --redis-ca-file, --redis-cert-file, --redis-key-file and --redis-server-name for it.
	RedisTLS bool
	// RedisSentinel adds a replica and a Sentinel (Stack.Sentinel) and points kubescribe at the
	// Sentinel (--redis-addr, --redis-master-name), so that a test can fail the master over.
	RedisSentinel bool
	// ReplicaArgs are more flags for the processes of StartReplicas, after the stack's own (a
	// flag given twice takes the later value).
	ReplicaArgs []string
}

// Stack is a running control plane with kubescribe installed and running.
type Stack struct {
	*controlplane.ControlPlane
	// OpsURL is kubescribe's ops endpoint (http://127.0.0.1:port): /healthz and /readyz.
	OpsURL string
	// MetricsURL is kubescribe's /metrics (https://127.0.0.1:port/metrics), served with the
	// control plane's audit serving certificate (signed by its CA). Read it with ScrapeMetrics
	// or GetMetrics.
	MetricsURL string
	// MetricsToken is a token of the ServiceAccount MetricsReader, bound to deploy/base/rbac.yaml's
	// ClusterRole kubescribe-metrics-reader, as Prometheus' would be.
	MetricsToken string
	// LogPath is kubescribe's own log.
	LogPath string
	// Sentinel, with Options.RedisSentinel, is the replica and Sentinel kubescribe reaches
	// Redis through.
	Sentinel *controlplane.Sentinel
	// AdmissionURL is kubescribe's CommitRequest webhook, served over TLS with the control
	// plane's audit serving certificate (signed by its CA); its address is kept across restarts.
	AdmissionURL string

	grace time.Duration
	// replicaArgs is Options.ReplicaArgs.
	replicaArgs []string
	// auditRouteNamespaces is Options.AuditRouteNamespaces.
	auditRouteNamespaces map[string][]string
	// kubescribeConfig is Options.KubescribeConfig.
	kubescribeConfig func(*rest.Config) (*rest.Config, error)
	app              *app.App
	logFile          *os.File
	cancel           context.CancelFunc
	done             chan error
	// proc is kubescribe when it runs as a process (StartKubescribeProcess).
	proc *exec.Cmd
	// metricsClient verifies kubescribe's serving certificate with the control plane's CA.
	metricsClient *http.Client

	// admissionAddr is kept across restarts, so the webhook registration stays valid.
	admissionAddr string
	// The replicas of StartReplicas, by name, behind auditLB and admissionLB; serverBin runs
	// them.
	replicasMu           sync.Mutex
	replicas             map[string]*Replica
	auditLB, admissionLB *controlplane.Balancer
	serverBin            string
	// AttributionSource is kubescribe's --attribution-source from its next start on; "" is
	// the default.
	AttributionSource string
	// AdmissionToken gives kubescribe, from its next start on (in-process only), the control
	// plane's admission token file (Admission.TokenFile): its admission webhooks then also
	// accept the webhook tokens derived from Admission.Token (reviewhttp.WebhookToken) in their
	// URL path, as for a managed cluster, and Admission.Token itself as a bearer token.
	AdmissionToken bool
	// ManageAttributionWebhook makes kubescribe, from its next start on, manage the
	// attribution webhook configuration, reached at its admission address with the control
	// plane's CA.
	ManageAttributionWebhook bool
	// SecretDigestKey is kubescribe's digest key of Secrets' writes (--secret-digest-key-file)
	// from its next in-process start on; nil: none.
	SecretDigestKey []byte
}

// Start starts the stack and waits until kubescribe is ready.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: opts.Dir, Logf: logf, NoAuditWebhook: opts.NoAuditWebhook, RemoteRoutes: opts.RemoteRoutes,
		RedisTLS: opts.RedisTLS})
	if err != nil {
		return nil, err
	}
	s := &Stack{ControlPlane: cp, kubescribeConfig: opts.KubescribeConfig, AttributionSource: opts.AttributionSource,
		replicas: map[string]*Replica{}, replicaArgs: opts.ReplicaArgs, auditRouteNamespaces: opts.AuditRouteNamespaces}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if opts.RedisSentinel {
		if s.Sentinel, err = cp.StartSentinel(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.install(ctx); err != nil {
		return nil, fmt.Errorf("installing kubescribe: %w", err)
	}

	s.grace = opts.Grace
	if err := s.StartKubescribe(ctx); err != nil {
		return nil, err
	}
	if err := s.RegisterWebhook(ctx); err != nil {
		return nil, fmt.Errorf("registering the admission webhook: %w", err)
	}
	if err := s.WaitSecretRefsWebhook(ctx); err != nil {
		return nil, err
	}
	if !opts.NoAuditWebhook {
		if err := s.waitAuditDelivery(ctx); err != nil {
			return nil, err
		}
	}
	logf("stack: kubescribe ready (ops %s, metrics %s, log %s)", s.OpsURL, s.MetricsURL, s.LogPath)
	return s, nil
}

// waitAuditDelivery waits until kubescribe stored a first audit batch: the install's writes,
// whose batches the apiserver could not deliver before kubescribe listened, come with its
// first retry (10s later by default). Until a route has delivered to a kubescribe process, that
// process waits the resume grace for the fact of any change it cannot explain (the apiserver may
// not reach it yet); the tests start once it is reached.
func (s *Stack) waitAuditDelivery(ctx context.Context) error {
	const delivered = `kubescribe_audit_requests_total{code="200"}`
	deadline := time.Now().Add(90 * time.Second)
	for {
		m, err := s.ScrapeMetrics()
		if err == nil && m[delivered] > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubescribe received no audit batch within 90s (last scrape error: %v)", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// StartKubescribe starts kubescribe (again, after StopKubescribe) and waits until it is ready.
// Its log is appended to LogPath.
func (s *Stack) StartKubescribe(ctx context.Context) error {
	return s.StartKubescribeAs(ctx, s.ControlPlane.UserConfig("kubescribe"))
}

// StartKubescribeAs is StartKubescribe with kubescribe authenticated by cfg instead of as the
// token user "kubescribe" (for example as the ServiceAccount of deploy/base/rbac.yaml, holding
// only what the install grants). Stop it with StopKubescribe; StartKubescribe starts the usual
// one again.
func (s *Stack) StartKubescribeAs(ctx context.Context, cfg *rest.Config) error {
	cp := s.ControlPlane
	s.LogPath = filepath.Join(cp.Dir, "kubescribe.log")
	var err error
	if s.logFile, err = os.OpenFile(s.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
		return err
	}
	o := app.DefaultOptions()
	o.RestConfig = cfg
	if s.kubescribeConfig != nil {
		if o.RestConfig, err = s.kubescribeConfig(o.RestConfig); err != nil {
			return err
		}
	}
	o.RedisAddr = cp.RedisAddr
	if s.Sentinel != nil {
		o.RedisAddr, o.RedisMasterName = s.Sentinel.Addr, controlplane.SentinelMasterName
		o.RedisSentinelPassword = s.Sentinel.Password
	}
	if t := cp.RedisTLS; t != nil {
		o.RedisCAFile, o.RedisCertFile, o.RedisKeyFile, o.RedisServerName = t.CAFile, t.CertFile, t.KeyFile, controlplane.RedisServerName
	}
	o.AuditListenAddress = cp.Audit.ListenAddr
	o.OpsListenAddress = "127.0.0.1:0"
	o.MetricsListenAddress = "127.0.0.1:0"
	o.TLSCertFile, o.TLSKeyFile = cp.Audit.CertFile, cp.Audit.KeyFile
	o.AuditClientCAFile = cp.Audit.ClientCAFile
	o.AuditTokenFile = cp.Audit.TokenFile
	o.AuditClientCertRoutes = cp.Audit.CertRoutes
	o.AuditRouteNamespaces = s.auditRouteNamespaces
	// The apiserver presents its admission client certificate to this address only.
	o.AdmissionClientCAFile = cp.Admission.ClientCAFile
	if s.AdmissionToken {
		o.AdmissionTokenFile = cp.Admission.TokenFile
	}
	if s.admissionAddr == "" && cp.Admission.ListenAddr != "" {
		s.admissionAddr = cp.Admission.ListenAddr
	}
	if s.admissionAddr == "" {
		// Chosen once, outside the ephemeral range, and bound again at every restart.
		if s.admissionAddr, err = controlplane.FreeAddr(); err != nil {
			return err
		}
	}
	o.AdmissionListenAddress = s.admissionAddr
	o.ShutdownTimeout = 20 * time.Second
	o.ShutdownDelay = ShutdownDelay
	if s.grace > 0 {
		o.AttributionGrace = s.grace
	}
	if s.AttributionSource != "" {
		o.AttributionSource = s.AttributionSource
	}
	o.SecretDigestKey = s.SecretDigestKey
	if s.ManageAttributionWebhook {
		o.AttributionWebhookURL = "https://" + s.admissionAddr
		o.AttributionWebhookCAFile = cp.Audit.ClientCAFile // the control plane's CA
	}
	o.Logger = slog.New(slog.NewJSONHandler(s.logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if s.app, err = app.New(o); err != nil {
		return err
	}
	s.OpsURL = "http://" + s.app.OpsAddr().String()
	s.MetricsURL = "https://" + s.app.MetricsAddr().String() + "/metrics"
	s.admissionAddr = s.app.AdmissionAddr().String()
	s.AdmissionURL = "https://" + s.admissionAddr + authz.Path
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- s.app.Run(runCtx) }()
	return s.waitReady(ctx)
}

// StartKubescribeProcess runs kubescribe as the cmd/server binary bin, with the settings
// StartKubescribe uses, and waits until it is ready; KillKubescribe ends it as SIGKILL does.
// Its output is appended to LogPath.
func (s *Stack) StartKubescribeProcess(ctx context.Context, bin string) error {
	cp := s.ControlPlane
	s.LogPath = filepath.Join(cp.Dir, "kubescribe.log")
	var err error
	if s.logFile, err = os.OpenFile(s.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
		return err
	}
	opsAddr, err := controlplane.FreeAddr()
	if err != nil {
		return err
	}
	metricsAddr, err := controlplane.FreeAddr()
	if err != nil {
		return err
	}
	// The CommitRequest webhook on the address it was registered with (disabled when no
	// in-process kubescribe ran before to pick one).
	cmd := exec.Command(bin, s.processArgs(cp.Audit.ListenAddr, s.admissionAddr, opsAddr, metricsAddr)...)
	cmd.Stdout, cmd.Stderr = s.logFile, s.logFile
	if err := controlplane.StartChild(cmd); err != nil {
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	s.proc, s.OpsURL, s.MetricsURL = cmd, "http://"+opsAddr, "https://"+metricsAddr+"/metrics"
	s.done = make(chan error, 1)
	go func() { s.done <- cmd.Wait() }()
	return s.waitReady(ctx)
}

// processArgs are the flags of a kubescribe process of the stack listening on the given
// addresses, with the settings StartKubescribe uses.
func (s *Stack) processArgs(auditAddr, admissionAddr, opsAddr, metricsAddr string) []string {
	cp := s.ControlPlane
	grace := s.grace
	if grace <= 0 {
		grace = app.DefaultOptions().AttributionGrace
	}
	args := []string{
		"--kubeconfig=" + cp.KubeconfigPath("kubescribe"),
		"--redis-addr=" + cp.RedisAddr,
		"--audit-listen-address=" + auditAddr,
		"--ops-listen-address=" + opsAddr, "--metrics-listen-address=" + metricsAddr,
		"--tls-cert-file=" + cp.Audit.CertFile, "--tls-private-key-file=" + cp.Audit.KeyFile,
		"--audit-client-ca-file=" + cp.Audit.ClientCAFile, "--audit-token-file=" + cp.Audit.TokenFile,
		"--admission-listen-address=" + admissionAddr, "--admission-client-ca-file=" + cp.Admission.ClientCAFile,
		"--shutdown-timeout=20s", "--shutdown-delay=" + ShutdownDelay.String(), "--attribution-grace=" + grace.String(),
		"--log-format=json", "--log-level=debug",
	}
	if s.AttributionSource != "" {
		args = append(args, "--attribution-source="+s.AttributionSource)
	}
	if s.Sentinel != nil {
		args = append(args, "--redis-addr="+s.Sentinel.Addr, "--redis-master-name="+controlplane.SentinelMasterName,
			"--redis-sentinel-password-file="+s.Sentinel.PasswordFile)
	}
	if t := cp.RedisTLS; t != nil {
		args = append(args, "--redis-ca-file="+t.CAFile, "--redis-cert-file="+t.CertFile, "--redis-key-file="+t.KeyFile,
			"--redis-server-name="+controlplane.RedisServerName)
	}
	for cn, routes := range cp.Audit.CertRoutes {
		args = append(args, "--audit-client-cert-routes="+cn+"="+strings.Join(routes, ","))
	}
	for route, namespaces := range s.auditRouteNamespaces {
		args = append(args, "--audit-route-namespaces="+route+"="+strings.Join(namespaces, ","))
	}
	return args
}

// RunsProcess reports whether kubescribe runs as a process of its own
// (StartKubescribeProcess), rather than in the test's process.
func (s *Stack) RunsProcess() bool { return s.proc != nil }

// KillKubescribe kills a kubescribe started by StartKubescribeProcess with SIGKILL: nothing
// of its shutdown runs.
func (s *Stack) KillKubescribe() error {
	if s.proc == nil {
		return errors.New("kubescribe does not run as a process")
	}
	_ = s.proc.Process.Kill()
	<-s.done
	s.proc = nil
	if s.logFile != nil {
		_ = s.logFile.Close()
		s.logFile = nil
	}
	return nil
}

// StopKubescribe stops kubescribe gracefully, as SIGTERM does, and returns once it exited.
func (s *Stack) StopKubescribe() error {
	var err error
	if s.proc != nil {
		_ = s.proc.Process.Signal(syscall.SIGTERM)
		if perr := <-s.done; perr != nil {
			err = fmt.Errorf("kubescribe: %w", perr)
		}
		s.proc = nil
	}
	if s.cancel != nil {
		s.cancel()
		if rerr := <-s.done; rerr != nil {
			err = fmt.Errorf("kubescribe: %w", rerr)
		}
		s.cancel = nil
	}
	if s.logFile != nil {
		_ = s.logFile.Close()
		s.logFile = nil
	}
	return err
}

// Stop stops kubescribe gracefully, then the control plane.
func (s *Stack) Stop() error {
	errs := []error{s.stopReplicas(), s.StopKubescribe()}
	if s.Sentinel != nil {
		errs = append(errs, s.Sentinel.Stop())
	}
	if s.ControlPlane != nil {
		errs = append(errs, s.ControlPlane.Stop())
	}
	return errors.Join(errs...)
}

// LogPaths adds kubescribe's log to the control plane's.
func (s *Stack) LogPaths() []string {
	paths := append(s.ControlPlane.LogPaths(), s.LogPath)
	s.replicasMu.Lock()
	for _, r := range s.replicas {
		paths = append(paths, r.LogPath)
	}
	s.replicasMu.Unlock()
	return paths
}

// DumpLogs writes the tail of every log, kubescribe's included.
func (s *Stack) DumpLogs(w io.Writer, tailLines int) {
	s.ControlPlane.DumpLogs(w, tailLines)
	paths := []string{s.LogPath}
	s.replicasMu.Lock()
	for _, r := range s.replicas {
		paths = append(paths, r.LogPath)
	}
	s.replicasMu.Unlock()
	for _, path := range paths {
		if path == "" {
			continue
		}
		b, _ := os.ReadFile(path)
		lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
		if len(lines) > tailLines {
			lines = lines[len(lines)-tailLines:]
		}
		fmt.Fprintf(w, "==> %s <==\n%s\n", path, bytes.Join(lines, []byte("\n")))
	}
}

func (s *Stack) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.OpsURL + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = string(b)
		} else {
			last = err.Error()
		}
		select {
		case err := <-s.done:
			return fmt.Errorf("kubescribe stopped while starting: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("kubescribe not ready after a minute: %s", last)
}

// install applies deploy/crds and deploy/base's namespace and RBAC as admin and binds the
// kubescribe ClusterRole to the token user "kubescribe", as an operator would bind it to the
// ServiceAccount, and kubescribe-metrics-reader to the ServiceAccount MetricsReader.
func (s *Stack) install(ctx context.Context) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	// The generated CRDs, not the folder's kustomization.yaml.
	crds, _ := filepath.Glob(filepath.Join(root, "deploy", "crds", "kubescribe.dev_*.yaml"))
	files := append(crds, filepath.Join(root, "deploy", "base", "namespace.yaml"), filepath.Join(root, "deploy", "base", "rbac.yaml"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := Apply(ctx, s.AdminConfig, b); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	if err := s.grantTestUser(ctx, kube, root); err != nil {
		return err
	}
	if s.MetricsToken, err = grantMetricsReader(ctx, kube); err != nil {
		return err
	}
	if s.metricsClient, err = newMetricsClient(s.CA.CertPEM); err != nil {
		return err
	}
	// Wait until the CRDs are served.
	dc, err := discovery.NewDiscoveryClientForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := dc.ServerResourcesForGroupVersion("kubescribe.dev/v1alpha1")
		if err == nil && servedKinds(list) >= len(crds) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubescribe.dev/v1alpha1 not served after a minute: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestUserMirrorRole is the ClusterRole the token user "kubescribe" holds in the e2e stack on
// top of deploy/base/rbac.yaml's: the tests mirror whatever they like from whatever namespace, so
// they read every resource (Secrets included) cluster-wide, as no installation should. A test
// of the least-privilege install runs kubescribe as another identity (StartKubescribeAs).
const TestUserMirrorRole = "kubescribe-e2e-read-everything"

// grantTestUser binds the token user "kubescribe" to deploy/base/rbac.yaml's ClusterRole, to
// deploy/components/attribution-webhook/rbac.yaml's (for the tests that let kubescribe
// manage the attribution webhook) and to TestUserMirrorRole.
func (s *Stack) grantTestUser(ctx context.Context, kube kubernetes.Interface, root string) error {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "components", "attribution-webhook", "rbac.yaml"))
	if err != nil {
		return err
	}
	// Only its ClusterRole: its binding names the ServiceAccount kubescribe/kubescribe, which
	// the default install leaves without webhook rights.
	var webhookRole *rbacv1.ClusterRole
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var cr rbacv1.ClusterRole
		if err := dec.Decode(&cr); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("deploy/components/attribution-webhook/rbac.yaml: %w", err)
		}
		if cr.Kind == "ClusterRole" {
			webhookRole = &cr
		}
	}
	if webhookRole == nil {
		return errors.New("deploy/components/attribution-webhook/rbac.yaml holds no ClusterRole")
	}
	webhookRole.ResourceVersion = ""
	roles := []*rbacv1.ClusterRole{webhookRole, {
		ObjectMeta: metav1.ObjectMeta{Name: TestUserMirrorRole},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}},
	}}
	for _, r := range roles {
		if _, err := kube.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	// The member and leader Leases (deploy/base/rbac.yaml's Role kubescribe-leases).
	_, err = kube.RbacV1().RoleBindings("kubescribe").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubescribe-test-user-leases", Namespace: "kubescribe"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "kubescribe-leases"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "kubescribe"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	bindings := map[string]string{"kubescribe-test-user": "kubescribe", "kubescribe-test-user-webhook": webhookRole.Name,
		"kubescribe-test-user-read-everything": TestUserMirrorRole}
	for name, role := range bindings {
		_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "kubescribe"}},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// servedKinds counts the resources of list that are not subresources.
func servedKinds(list *metav1.APIResourceList) int {
	n := 0
	for _, r := range list.APIResources {
		if !strings.Contains(r.Name, "/") {
			n++
		}
	}
	return n
}

// RegisterWebhook registers (again) the CommitRequest ValidatingWebhookConfiguration that
// `kubescribe admission-webhook-config --url` prints, pointing at AdmissionURL with the control
// plane's CA. The apiserver takes a moment to start calling it.
func (s *Stack) RegisterWebhook(ctx context.Context) error {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	url := s.AdmissionURL
	cfg := authz.WebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: s.CA.CertPEM})
	_, err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// RemoveWebhook deletes the CommitRequest webhook registration, as an operator (or an attacker
// with that power) could: CommitRequests are then created without admission records.
func (s *Stack) RemoveWebhook(ctx context.Context) error {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, authz.WebhookConfigurationName, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Apply creates (or, when they exist, updates) every object of a multi-document YAML or JSON
// stream, as the user of cfg.
func Apply(ctx context.Context, cfg *rest.Config, manifests []byte) error {
	return apply(ctx, cfg, manifests, nil)
}

// DryRun is Apply with every create and update a server-side dry run (dryRun=All): the
// apiserver validates and admits each object as it would store it, and stores nothing. An
// object that exists is replaced (an update), not merged: what is checked is the object of the
// stream, whole. Namespaced objects need their namespace, and custom objects their CRD, to
// exist for real.
func DryRun(ctx context.Context, cfg *rest.Config, manifests []byte) error {
	return apply(ctx, cfg, manifests, []string{metav1.DryRunAll})
}

func apply(ctx context.Context, cfg *rest.Config, manifests []byte, dryRun []string) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version)
		if err != nil {
			mapper.Reset()
			if mapping, err = mapper.RESTMapping(schema.GroupKind{Group: gvk.Group, Kind: gvk.Kind}, gvk.Version); err != nil {
				return fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
			}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
		}
		// An object that exists is updated: looked up first, as kubectl apply does, since a
		// create can fail on something else before it finds the name taken (a Service's
		// clusterIP, already allocated to the Service itself). A conflict (the object written
		// meanwhile: a controller's status, kubescribe keeping a webhook's caBundle in step) is
		// retried on the version found then.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := ri.Get(ctx, u.GetName(), metav1.GetOptions{})
			switch {
			case err == nil:
				u.SetResourceVersion(cur.GetResourceVersion())
				_, err = ri.Update(ctx, u, metav1.UpdateOptions{DryRun: dryRun})
			case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
				// A user who may create but not read (a CommitRequest's author) creates.
				u.SetResourceVersion("")
				_, err = ri.Create(ctx, u, metav1.CreateOptions{DryRun: dryRun})
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err)
		}
	}
}

// RepoRoot is the main module's root directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/kubescribe/kubescribe\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the kubescribe module")
		}
		dir = parent
	}
}

// AttributionURL is kubescribe's attribution webhook for the control plane's cluster.
func (s *Stack) AttributionURL() string {
	return "https://" + s.admissionAddr + admission.PathPrefix + "local"
}

// RegisterAttributionWebhook registers (or replaces) the attribution
// ValidatingWebhookConfiguration for the given resources, pointing at AttributionURL with the
// control plane's CA, as `kubescribe admission-webhook-config --attribution` prints it.
func (s *Stack) RegisterAttributionWebhook(ctx context.Context, resources []admission.Resource) error {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	url := s.AttributionURL()
	cfg := admission.WebhookConfiguration(admission.WebhookOptions{
		ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: s.CA.CertPEM},
		Resources:         resources,
		ExcludeNamespaces: []string{"kubescribe-system"},
	})
	vwcs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	old, err := vwcs.Get(ctx, cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = vwcs.Create(ctx, cfg, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	cfg.ResourceVersion = old.ResourceVersion
	_, err = vwcs.Update(ctx, cfg, metav1.UpdateOptions{})
	return err
}

// RemoveAttributionWebhook deletes the attribution webhook registration.
func (s *Stack) RemoveAttributionWebhook(ctx context.Context) error {
	kube, err := kubernetes.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, admission.WebhookConfigurationName, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
