// Package controlplane starts a real, throw-away Kubernetes control plane for kubescribe's
// end-to-end tests and for `make demo`: etcd, kube-apiserver (audit webhook pointed at the
// kubescribe under test), redis-server and an HTTPS Git server, all on free ports of
// 127.0.0.1, with their data, certificates and logs under one directory.
//
// No controller-manager or scheduler runs: nothing garbage-collects, finalizes namespaces,
// creates service accounts or reconciles Deployments. See docs/testing.md.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// Users are the token users the apiserver knows. admin is in system:masters; alice, bob and
// carol are ordinary users without any RBAC binding; kubescribe is the identity for the
// kubescribe under test and also has no binding until a test grants one.
var Users = []string{"admin", "alice", "bob", "carol", "kubescribe"}

// userGroups lists the groups (besides system:authenticated) each token user is in.
var userGroups = map[string][]string{"admin": {"system:masters"}}

// Readiness deadlines; each is further bounded by Start's context.
const (
	etcdReadyTimeout      = 60 * time.Second
	apiserverReadyTimeout = 3 * time.Minute
	redisReadyTimeout     = 30 * time.Second
)

// Options configures Start.
type Options struct {
	// Dir holds data, certificates, kubeconfigs and logs. Required; it must exist or be
	// creatable. Tests pass t.TempDir().
	Dir string
	// AuditRoute is the {route} of the audit webhook URL (/audit/<route>). Default "local".
	AuditRoute string
	// Logf, when set, receives progress messages (t.Logf fits).
	Logf func(format string, args ...any)
	// NoAuditWebhook starts kube-apiserver without an audit webhook, as on a managed cluster
	// whose audit flags are out of reach (Audit still names an endpoint; nothing calls it).
	NoAuditWebhook bool
	// RemoteRoutes are the routes of the remote clusters StartRemote may start later: their
	// apiservers' audit client certificates (common name RemoteAuditCertCN(route)) are bound
	// to them in Audit.CertRoutes, for the kubescribe under test to be configured with.
	RemoteRoutes []string
	// RedisTLS runs redis-server on TLS only, requiring a client certificate of the control
	// plane's CA (tls-auth-clients yes): ControlPlane.RedisTLS has the files.
	RedisTLS bool
}

// RedisTLSFiles are the files of a TLS-only redis-server: the CA that signed its certificate
// (for 127.0.0.1 and RedisServerName) and the client certificate it requires.
type RedisTLSFiles struct {
	CAFile, CertFile, KeyFile     string // CA; the client's certificate and key
	ServerCertFile, ServerKeyFile string
}

// RedisServerName is a DNS name the TLS redis-server's certificate carries besides 127.0.0.1.
const RedisServerName = "redis.kubescribe.test"

// RedisTLSClientCN is the common name of the client certificate of RedisTLSFiles.
const RedisTLSClientCN = "kubescribe"

// RemoteAuditCertCN is the common name of the audit client certificate of the remote cluster
// of route.
func RemoteAuditCertCN(route string) string { return "kube-apiserver-" + route }

// ControlPlane is a running control plane. Stop it when done.
type ControlPlane struct {
	// Dir is Options.Dir.
	Dir string
	// AdminConfig authenticates as user "admin" (group system:masters).
	AdminConfig *rest.Config
	// RedisAddr is redis-server's 127.0.0.1:port; no password.
	RedisAddr string
	// RedisTLS, with Options.RedisTLS, holds the files of Redis' TLS; nil for plain TCP.
	RedisTLS *RedisTLSFiles
	// Git is the HTTPS Git server.
	Git *GitServer
	// Audit says where the kubescribe under test must serve the audit webhook.
	Audit AuditEndpoint
	// Admission says where the kubescribe under test must serve its admission webhooks: the
	// apiserver presents a client certificate to that address (its AdmissionConfiguration).
	Admission AdmissionEndpoint
	// CA signed every certificate of the control plane.
	CA *CA

	logf     func(format string, args ...any)
	apiURL   string
	tokens   map[string]string // user -> bearer token
	etcd     *process
	api      *process
	redisBin string
	redisMu  sync.Mutex
	redis    *process
	logPaths []string
	noAudit  bool // Options.NoAuditWebhook
	// remoteRoute is the route of a remote cluster's control plane (StartRemote).
	remoteRoute string

	stopOnce sync.Once
	stopErr  error
}

// AuditEndpoint is where the apiserver sends audit events: the kubescribe under test must
// listen on ListenAddr with TLS, using CertFile/KeyFile, and accept the apiserver's client
// certificate (signed by ClientCAFile).
type AuditEndpoint struct {
	// ListenAddr is 127.0.0.1:port, chosen at start; nothing listens there until the test does.
	ListenAddr string
	// URL is https://<ListenAddr>/audit/<route>, as configured in the apiserver.
	URL string
	// CertFile and KeyFile are a serving certificate for 127.0.0.1 (and localhost) signed by the
	// test CA.
	CertFile, KeyFile string
	// ClientCAFile holds the CA that signed the apiserver's webhook client certificate (the
	// test CA, so it also verifies every other certificate here).
	ClientCAFile string
	// TokenFile holds Token, a bearer token the apiserver is NOT configured with, bound to the
	// local route: for tests of kubescribe's token authentication. It also holds TenantToken,
	// bound to TenantRoute only.
	TokenFile   string
	Token       string
	TenantToken string
	TenantRoute string
	// CertRoutes binds the audit client certificates of the remote clusters of
	// Options.RemoteRoutes to their routes (kubescribe's --audit-client-cert-routes).
	CertRoutes map[string][]string
}

// AdmissionEndpoint is where the apiserver calls kubescribe's admission webhooks.
type AdmissionEndpoint struct {
	// ListenAddr is 127.0.0.1:port, chosen at start; the apiserver's admission kubeconfig
	// names it, so it presents a client certificate (common name ClientCertCN, signed by the
	// test CA) to a webhook at that address only.
	ListenAddr string
	// ClientCAFile verifies that certificate (the test CA).
	ClientCAFile string
	ClientCertCN string
	// TokenFile holds Token, bound to the local route: kubescribe's --admission-token-file,
	// for a webhook URL carrying the token (as on a managed cluster, whose apiserver presents
	// no certificate: the apiserver presents none to a host other than ListenAddr's).
	TokenFile string
	Token     string
}

// Start assembles and starts the control plane and waits until every part is ready. If any
// step fails, whatever was started is stopped again before Start returns the error.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	if opts.Dir == "" {
		return nil, errors.New("controlplane: Options.Dir is required")
	}
	if opts.AuditRoute == "" {
		opts.AuditRoute = "local"
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	// etcd makes its data directory itself, with the permissions it wants (0700; etcd 3.7
	// warns about any other).
	for _, d := range []string{"certs", "redis", "git", "kubeconfig"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}

	began := time.Now()
	cp := &ControlPlane{Dir: dir, logf: logf, redisBin: bins.redis, noAudit: opts.NoAuditWebhook}
	defer func() {
		if err != nil {
			if stopErr := cp.Stop(); stopErr != nil {
				logf("controlplane: cleanup after failed start: %v", stopErr)
			}
		}
	}()

	if cp.CA, err = NewCA("kubescribe-test-ca"); err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "certs", "ca.crt")
	if err := os.WriteFile(caFile, cp.CA.CertPEM, 0o644); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	// etcd client, etcd peer, apiserver, redis, audit endpoint, admission endpoint.
	ports, err := FreePorts(6)
	if err != nil {
		return nil, err
	}
	etcdPort, etcdPeerPort, apiPort, redisPort, auditPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	cp.Admission = AdmissionEndpoint{ListenAddr: "127.0.0.1:" + strconv.Itoa(ports[5]), ClientCAFile: caFile, ClientCertCN: "kube-apiserver-admission",
		TokenFile: filepath.Join(dir, "certs", "admission-token")}
	if cp.Admission.Token, err = randomToken(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(cp.Admission.TokenFile, []byte(cp.Admission.Token+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	cp.apiURL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	cp.RedisAddr = "127.0.0.1:" + strconv.Itoa(redisPort)
	if opts.RedisTLS {
		if cp.RedisTLS, err = cp.issueRedisTLS(caFile); err != nil {
			return nil, err
		}
	}

	if err := cp.prepareAuditEndpoint(auditPort, opts.AuditRoute, caFile); err != nil {
		return nil, err
	}
	for _, r := range opts.RemoteRoutes {
		if cp.Audit.CertRoutes == nil {
			cp.Audit.CertRoutes = map[string][]string{}
		}
		cp.Audit.CertRoutes[RemoteAuditCertCN(r)] = []string{r}
	}
	if err := cp.prepareUsers(); err != nil {
		return nil, err
	}

	gitLog := filepath.Join(dir, "git.log")
	cp.logPaths = append(cp.logPaths, gitLog)
	if cp.Git, err = startGitServer(bins.git, filepath.Join(dir, "git"), gitLog, cp.CA); err != nil {
		return nil, err
	}
	logf("controlplane: git server at https://%s (%s)", cp.Git.addr, gitLog)

	if err := cp.startRedisProcess(); err != nil {
		return nil, err
	}
	if cp.etcd, err = cp.startEtcd(bins.etcd, etcdPort, etcdPeerPort); err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	if err := waitReady(ctx, cp.etcd, etcdReadyTimeout, func(ctx context.Context) error { return etcdHealthy(ctx, etcdURL) }); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	logf("controlplane: etcd ready at %s after %s", etcdURL, time.Since(began).Round(time.Millisecond))

	if cp.api, err = cp.startAPIServer(bins.kubeAPIServer, etcdURL, apiPort); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, cp.redis, redisReadyTimeout, func(ctx context.Context) error { return cp.redisPing(ctx) }); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	logf("controlplane: redis ready at %s after %s", cp.RedisAddr, time.Since(began).Round(time.Millisecond))
	if err := waitReady(ctx, cp.api, apiserverReadyTimeout, func(ctx context.Context) error { return apiserverReady(ctx, cp.AdminConfig) }); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	logf("controlplane: kube-apiserver ready at %s after %s", cp.apiURL, time.Since(began).Round(time.Millisecond))
	return cp, nil
}

// prepareAuditEndpoint picks the audit endpoint's address and writes its certificates and
// token.
func (cp *ControlPlane) prepareAuditEndpoint(port int, route, caFile string) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	certPEM, keyPEM, err := cp.CA.Issue("kubescribe-audit", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, false)
	if err != nil {
		return err
	}
	token, err := randomToken()
	if err != nil {
		return err
	}
	tenantToken, err := randomToken()
	if err != nil {
		return err
	}
	cp.Audit = AuditEndpoint{
		ListenAddr:   addr,
		URL:          "https://" + addr + "/audit/" + route,
		CertFile:     filepath.Join(cp.Dir, "certs", "audit-server.crt"),
		KeyFile:      filepath.Join(cp.Dir, "certs", "audit-server.key"),
		ClientCAFile: caFile,
		TokenFile:    filepath.Join(cp.Dir, "certs", "audit-token"),
		Token:        token,
		TenantToken:  tenantToken,
		TenantRoute:  "tenant-a",
	}
	for path, data := range map[string][]byte{
		cp.Audit.CertFile:  certPEM,
		cp.Audit.KeyFile:   keyPEM,
		cp.Audit.TokenFile: []byte(token + "\n" + tenantToken + " " + cp.Audit.TenantRoute + "\n"),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return fmt.Errorf("controlplane: %w", err)
		}
	}
	return nil
}

// prepareUsers generates a token per user, the apiserver's token file, a kubeconfig per user
// and AdminConfig.
func (cp *ControlPlane) prepareUsers() error {
	cp.tokens = make(map[string]string, len(Users))
	var csv []byte
	for _, u := range Users {
		tok, err := randomToken()
		if err != nil {
			return err
		}
		cp.tokens[u] = tok
		// token,user,uid[,"group1,group2"]
		line := fmt.Sprintf("%s,%s,%s", tok, u, u+"-uid")
		if g := userGroups[u]; len(g) > 0 {
			line += fmt.Sprintf(",%q", strings.Join(g, ","))
		}
		csv = append(csv, line+"\n"...)

		kc := clientcmdapi.NewConfig()
		kc.Clusters["controlplane"] = &clientcmdapi.Cluster{Server: cp.apiURL, CertificateAuthorityData: cp.CA.CertPEM}
		kc.AuthInfos[u] = &clientcmdapi.AuthInfo{Token: tok}
		kc.Contexts[u] = &clientcmdapi.Context{Cluster: "controlplane", AuthInfo: u, Namespace: "default"}
		kc.CurrentContext = u
		if err := clientcmd.WriteToFile(*kc, cp.KubeconfigPath(u)); err != nil {
			return fmt.Errorf("controlplane: kubeconfig for %s: %w", u, err)
		}
	}
	if err := os.WriteFile(filepath.Join(cp.Dir, "certs", "tokens.csv"), csv, 0o600); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	cp.AdminConfig = cp.UserConfig("admin")
	return nil
}

// KubeconfigPath returns the kubeconfig file for a token user (one of Users). It is written
// at Start; the path of an unknown user does not exist.
func (cp *ControlPlane) KubeconfigPath(user string) string {
	return filepath.Join(cp.Dir, "kubeconfig", user+".kubeconfig")
}

// UserConfig returns a new rest.Config that authenticates as a token user (one of Users).
// It panics on an unknown user: that is a bug in the test.
func (cp *ControlPlane) UserConfig(user string) *rest.Config {
	tok, ok := cp.tokens[user]
	if !ok {
		panic(fmt.Sprintf("controlplane: unknown user %q (known: %v)", user, Users))
	}
	return &rest.Config{
		Host:            cp.apiURL,
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CA.CertPEM},
		// Tests issue bursts of requests; client-side throttling only slows them down.
		QPS:   100,
		Burst: 200,
	}
}

// StopRedis stops redis-server (SIGTERM, SIGKILL after 5s), to test Redis going away.
func (cp *ControlPlane) StopRedis() error {
	cp.redisMu.Lock()
	defer cp.redisMu.Unlock()
	err := cp.redis.stop()
	cp.logf("controlplane: redis stopped")
	return err
}

// StartRedis starts redis-server again on the same address (empty: nothing is persisted) and
// waits until it answers PING. It does nothing when Redis is running.
func (cp *ControlPlane) StartRedis() error {
	cp.redisMu.Lock()
	defer cp.redisMu.Unlock()
	if cp.redis != nil && !cp.redis.exited() {
		return nil
	}
	if err := cp.startRedisLocked(); err != nil {
		return err
	}
	if err := waitReady(context.Background(), cp.redis, redisReadyTimeout, func(ctx context.Context) error { return cp.redisPing(ctx) }); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	cp.logf("controlplane: redis restarted at %s", cp.RedisAddr)
	return nil
}

// Stop stops kube-apiserver first (so it sends no more audit events), then etcd, redis-server
// and the Git server. Each process gets SIGTERM and, after 5s, SIGKILL. Stop is idempotent
// and returns the same result every time.
func (cp *ControlPlane) Stop() error {
	cp.stopOnce.Do(func() {
		var errs []error
		errs = append(errs, cp.api.stop(), cp.etcd.stop())
		cp.redisMu.Lock()
		errs = append(errs, cp.redis.stop())
		cp.redisMu.Unlock()
		cp.Git.Stop()
		cp.stopErr = errors.Join(errs...)
	})
	return cp.stopErr
}

// LogPaths lists the log files of the control plane's parts.
func (cp *ControlPlane) LogPaths() []string {
	return append([]string(nil), cp.logPaths...)
}

// DumpLogs writes the last tailLines lines of every log to w: for a failing test's output.
func (cp *ControlPlane) DumpLogs(w io.Writer, tailLines int) {
	for _, p := range cp.logPaths {
		fmt.Fprintf(w, "===== %s (last %d lines) =====\n", p, tailLines)
		writeTail(w, p, tailLines)
	}
}

// writeAdmissionConfig writes the apiserver's AdmissionConfiguration: the
// ValidatingAdmissionWebhook plugin presents a client certificate (ClientCertCN, signed by the
// test CA) to a webhook at Admission.ListenAddr, as an operator configures it for kubescribe.
func (cp *ControlPlane) writeAdmissionConfig() (string, error) {
	certPEM, keyPEM, err := cp.CA.Issue(cp.Admission.ClientCertCN, nil, nil, true)
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	// The user's name is the webhook's host:port: the apiserver picks the credentials by it.
	kc.AuthInfos[cp.Admission.ListenAddr] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kubeconfig := filepath.Join(cp.Dir, "admission-webhook.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", fmt.Errorf("controlplane: %w", err)
	}
	config := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %q
`, kubeconfig)
	path := filepath.Join(cp.Dir, "admission-config.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return "", fmt.Errorf("controlplane: %w", err)
	}
	return path, nil
}

// writeAuditConfig writes the product's own audit policy and webhook kubeconfig, with a
// client certificate for CN kube-apiserver (RemoteAuditCertCN(route) for a remote), and
// returns their paths.
func (cp *ControlPlane) writeAuditConfig() (policyPath, webhookPath string, err error) {
	cn := "kube-apiserver"
	if cp.remoteRoute != "" {
		cn = RemoteAuditCertCN(cp.remoteRoute)
	}
	certPEM, keyPEM, err := cp.CA.Issue(cn, nil, nil, true)
	if err != nil {
		return "", "", err
	}
	kubeconfig, err := audit.WebhookKubeconfig(audit.WebhookConfig{
		URL:            cp.Audit.URL,
		CAData:         cp.CA.CertPEM,
		ClientCertData: certPEM,
		ClientKeyData:  keyPEM,
	})
	if err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	policyPath = filepath.Join(cp.Dir, "audit-policy.yaml")
	webhookPath = filepath.Join(cp.Dir, "audit-webhook.kubeconfig")
	if err := os.WriteFile(policyPath, audit.Policy(), 0o644); err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	if err := os.WriteFile(webhookPath, kubeconfig, 0o600); err != nil {
		return "", "", fmt.Errorf("controlplane: %w", err)
	}
	return policyPath, webhookPath, nil
}
