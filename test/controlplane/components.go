package controlplane

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// modulePath is the module whose bin/ holds the binaries the Makefile builds.
const modulePath = "github.com/kubescribe/kubescribe"

type binaries struct {
	kubeAPIServer, etcd, redis, git string
}

// A builtBinary is built by the Makefile target of its name into <module root>/bin, from a
// module of its own (test/kube-apiserver, test/etcd), and found through its environment variable.
type builtBinary struct{ name, env string }

var (
	kubeAPIServerBinary = builtBinary{"kube-apiserver", "KUBE_APISERVER"}
	// etcd is v3.7.0, not Debian's 3.4: kube-apiserver v1.37 disables its watch progress
	// requests on etcd older than 3.4.31/3.5.13, and a watch-list client then fails.
	etcdBinary = builtBinary{"etcd", "ETCD"}
)

// findBinaries locates kube-apiserver and etcd (each from its environment variable, else
// <module root>/bin) and redis-server and git on $PATH.
func findBinaries() (binaries, error) {
	var b binaries
	var err error
	if b.kubeAPIServer, err = kubeAPIServerBinary.find(); err != nil {
		return b, err
	}
	if b.etcd, err = etcdBinary.find(); err != nil {
		return b, err
	}
	for _, x := range []struct {
		name string
		dst  *string
	}{{"redis-server", &b.redis}, {"git", &b.git}} {
		if *x.dst, err = exec.LookPath(x.name); err != nil {
			return b, fmt.Errorf("controlplane: %s not found on PATH (run `make deps`, or apt-get install redis-server git): %w", x.name, err)
		}
	}
	return b, nil
}

// find returns $env when set, else <module root>/bin/<name>.
func (b builtBinary) find() (string, error) {
	if p := os.Getenv(b.env); p != "" {
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("controlplane: %s=%s: %w", b.env, p, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", fmt.Errorf("controlplane: %s is not set and %w; run `make %s` and set %s=<repo>/bin/%s", b.env, err, b.name, b.env, b.name)
	}
	return b.inRoot(root)
}

// inRoot returns <root>/bin/<name>, where `make <name>` puts it.
func (b builtBinary) inRoot(root string) (string, error) {
	p := filepath.Join(root, "bin", b.name)
	if err := checkExecutable(p); err != nil {
		return "", fmt.Errorf("controlplane: %s binary not found: %w; run `make %s` in %s (or set %s)", b.name, err, b.name, root, b.env)
	}
	return p, nil
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// ModuleRoot finds the kubescribe module root above the working directory (go test runs in
// the package directory) or, failing that, above this source file (unknown in a build made
// with -trimpath, as make's are).
func ModuleRoot() (string, error) { return moduleRoot() }

func moduleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if isModuleRoot(dir) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("no go.mod of module %s found above %v", modulePath, starts)
}

func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == modulePath
		}
	}
	return false
}

// startEtcd starts a single-member etcd with plain-HTTP client and peer URLs on 127.0.0.1.
func (cp *ControlPlane) startEtcd(bin string, clientPort, peerPort int) (*process, error) {
	clientURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	args := []string{
		"--name=controlplane",
		"--data-dir=" + filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=controlplane=" + peerURL,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-outputs=stderr",
	}
	// Durability is pointless for a throw-away store; skip fsync where etcd can. The probe
	// lets $ETCD still name an etcd without the flag (Debian's 3.4.23), to compare against.
	if etcdSupports(bin, "--unsafe-no-fsync") {
		args = append(args, "--unsafe-no-fsync")
	}
	env := os.Environ()
	switch runtime.GOARCH {
	case "amd64", "arm64", "ppc64le", "s390x":
	default:
		// etcd refuses to run on an architecture it does not support unless told to; it
		// warns about the variable on one it does.
		env = append(env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH)
	}
	logPath := filepath.Join(cp.Dir, "etcd.log")
	cp.logPaths = append(cp.logPaths, logPath)
	return startProcess("etcd", logPath, bin, args, env, cp.logf)
}

// etcdSupports reports whether `etcd --help` mentions flag.
func etcdSupports(bin, flag string) bool {
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	return strings.Contains(string(out), flag)
}

// startAPIServer writes the apiserver's configuration and starts it.
func (cp *ControlPlane) startAPIServer(bin, etcdURL string, port int) (*process, error) {
	certs := filepath.Join(cp.Dir, "certs")
	certPEM, keyPEM, err := cp.CA.Issue("kube-apiserver",
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 0, 0, 1)}, false)
	if err != nil {
		return nil, err
	}
	saKey, saPub, err := serviceAccountKeys()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"apiserver.crt": certPEM,
		"apiserver.key": keyPEM,
		"sa.key":        saKey,
		"sa.pub":        saPub,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(certs, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	policyPath, webhookPath, err := cp.writeAuditConfig()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The endpoint reconciler refuses a loopback address, and no one needs the endpoints of
		// the "kubernetes" Service here.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + filepath.Join(certs, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(certs, "apiserver.key"),
		"--client-ca-file=" + filepath.Join(certs, "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(certs, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(certs, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--token-auth-file=" + filepath.Join(certs, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--profiling=false",
	}
	if cp.Admission.ListenAddr != "" {
		admissionConfig, err := cp.writeAdmissionConfig()
		if err != nil {
			return nil, err
		}
		args = append(args, "--admission-control-config-file="+admissionConfig)
	}
	if !cp.noAudit {
		// The audit webhook's retries run on the upstream default (--audit-webhook-initial-backoff
		// 10s, x1.5, 5 attempts), as kubeadm and every distribution ship it: the restart, crash
		// and outage tests prove kubescribe keeps its authors on that schedule. Only the batch
		// wait is shortened (upstream 30s), to kubescribe's documented setting: every test
		// waits for at least one batch, and 30s each would make the suite take hours. The
		// resume grace covers the 30s default (attribution.DefaultResumeGrace).
		args = append(args,
			"--audit-policy-file="+policyPath,
			"--audit-webhook-config-file="+webhookPath,
			"--audit-webhook-batch-max-wait=1s")
	}
	logPath := filepath.Join(cp.Dir, "kube-apiserver.log")
	cp.logPaths = append(cp.logPaths, logPath)
	return startProcess("kube-apiserver", logPath, bin, args, os.Environ(), cp.logf)
}

// startRedisProcess starts redis-server for the first time (no waiting).
func (cp *ControlPlane) startRedisProcess() error {
	cp.redisMu.Lock()
	defer cp.redisMu.Unlock()
	cp.logPaths = append(cp.logPaths, filepath.Join(cp.Dir, "redis.log"))
	return cp.startRedisLocked()
}

func (cp *ControlPlane) startRedisLocked() error {
	_, port, _ := net.SplitHostPort(cp.RedisAddr)
	args := []string{
		"--port", port,
	}
	if t := cp.RedisTLS; t != nil {
		args = []string{"--port", "0", "--tls-port", port, "--tls-cert-file", t.ServerCertFile, "--tls-key-file", t.ServerKeyFile,
			"--tls-ca-cert-file", t.CAFile, "--tls-auth-clients", "yes"}
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", filepath.Join(cp.Dir, "redis"),
	)
	p, err := startProcess("redis-server", filepath.Join(cp.Dir, "redis.log"), cp.redisBin, args, os.Environ(), cp.logf)
	if err != nil {
		return err
	}
	cp.redis = p
	return nil
}

// etcdHealthy asks etcd's /health endpoint.
func etcdHealthy(ctx context.Context, baseURL string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd /health: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// apiserverReady asks the apiserver's /readyz as the admin.
func apiserverReady(ctx context.Context, cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		if len(body) > 0 {
			return fmt.Errorf("%w: %s", err, lastLines(string(body), 10))
		}
		return err
	}
	return nil
}

// issueRedisTLS writes the certificates of a TLS-only redis-server into certs/: its serving
// certificate and the client certificate it requires, both of the control plane's CA.
func (cp *ControlPlane) issueRedisTLS(caFile string) (*RedisTLSFiles, error) {
	f := &RedisTLSFiles{CAFile: caFile}
	for _, c := range []struct {
		name              string
		client            bool
		certFile, keyFile *string
	}{{"redis-server", false, &f.ServerCertFile, &f.ServerKeyFile}, {"redis-client", true, &f.CertFile, &f.KeyFile}} {
		var certPEM, keyPEM []byte
		var err error
		if c.client {
			certPEM, keyPEM, err = cp.CA.Issue(RedisTLSClientCN, nil, nil, true)
		} else {
			certPEM, keyPEM, err = cp.CA.Issue("redis", []string{RedisServerName}, []net.IP{net.ParseIP("127.0.0.1")}, false)
		}
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		*c.certFile, *c.keyFile = filepath.Join(cp.Dir, "certs", c.name+".crt"), filepath.Join(cp.Dir, "certs", c.name+".key")
		if err := os.WriteFile(*c.certFile, certPEM, 0o644); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		if err := os.WriteFile(*c.keyFile, keyPEM, 0o600); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	return f, nil
}

// redisPing sends PING in RESP to the control plane's redis-server (over TLS with the client
// certificate when it has one) and expects +PONG.
func (cp *ControlPlane) redisPing(ctx context.Context) error {
	var conn net.Conn
	var err error
	if t := cp.RedisTLS; t != nil {
		pair, perr := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if perr != nil {
			return perr
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(cp.CA.CertPEM)
		d := tls.Dialer{Config: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, ServerName: RedisServerName, MinVersion: tls.VersionTLS12}}
		conn, err = d.DialContext(ctx, "tcp", cp.RedisAddr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", cp.RedisAddr)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("redis PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("controlplane: random token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
