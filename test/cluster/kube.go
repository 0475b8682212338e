package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

// kubeletClientCN is the user the apiserver authenticates as to the kubelet.
const kubeletClientCN = "kube-apiserver-kubelet-client"

// The components' own token users: the names and groups their default RBAC (and the Node
// authorizer) expect.
var components = map[string][]string{
	"system:node:" + NodeName:        {"system:nodes"},
	"system:kube-proxy":              nil,
	"system:kube-controller-manager": nil,
	"system:kube-scheduler":          nil,
}

func (c *Cluster) certPath(name string) string { return filepath.Join(c.Dir, "pki", name) }

// APIServerURL is where the apiserver listens: the node IP, on the bridge.
func APIServerURL() string { return "https://" + net.JoinHostPort(NodeIP, strconv.Itoa(APIServerPort)) }

// writePKI writes the CA, the apiserver's serving and kubelet-client certificates, the
// service-account keys, the token file and a kubeconfig per user and component.
func (c *Cluster) writePKI() error {
	if err := os.MkdirAll(filepath.Join(c.Dir, "pki"), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "kubeconfig"), 0o700); err != nil {
		return err
	}
	var err error
	if c.CA, err = controlplane.NewCA("kubescribe-node-ca"); err != nil {
		return err
	}
	serving, servingKey, err := c.CA.Issue("kube-apiserver",
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.ParseIP(NodeIP), net.ParseIP("10.96.0.1"), net.IPv4(127, 0, 0, 1)}, false)
	if err != nil {
		return err
	}
	kc, kcKey, err := c.CA.Issue(kubeletClientCN, nil, nil, true)
	if err != nil {
		return err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt":             c.CA.CertPEM,
		"apiserver.crt":      serving,
		"apiserver.key":      servingKey,
		"kubelet-client.crt": kc,
		"kubelet-client.key": kcKey,
		"sa.key":             pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(sa)}),
		"sa.pub":             pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	}
	c.tokens = map[string]string{}
	var csv strings.Builder
	users := map[string][]string{"admin": {"system:masters"}}
	for _, u := range Users {
		if _, ok := users[u]; !ok {
			users[u] = nil
		}
	}
	for u, g := range components {
		users[u] = g
	}
	for u, groups := range users {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		tok := hex.EncodeToString(b)
		c.tokens[u] = tok
		fmt.Fprintf(&csv, "%s,%s,%s", tok, u, u+"-uid")
		if len(groups) > 0 {
			fmt.Fprintf(&csv, ",%q", strings.Join(groups, ","))
		}
		csv.WriteString("\n")
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["node"] = &clientcmdapi.Cluster{Server: APIServerURL(), CertificateAuthorityData: c.CA.CertPEM}
		cfg.AuthInfos[u] = &clientcmdapi.AuthInfo{Token: tok}
		cfg.Contexts[u] = &clientcmdapi.Context{Cluster: "node", AuthInfo: u, Namespace: "default"}
		cfg.CurrentContext = u
		if err := clientcmd.WriteToFile(*cfg, c.KubeconfigPath(u)); err != nil {
			return err
		}
	}
	files["tokens.csv"] = []byte(csv.String())
	for name, data := range files {
		if err := os.WriteFile(c.certPath(name), data, 0o600); err != nil {
			return err
		}
	}
	c.AdminConfig = c.UserConfig("admin")
	c.Client, err = kubernetes.NewForConfig(c.AdminConfig)
	return err
}

// KubeconfigPath is the kubeconfig of a user of Users (or a component's user).
func (c *Cluster) KubeconfigPath(user string) string {
	return filepath.Join(c.Dir, "kubeconfig", strings.ReplaceAll(user, ":", "_")+".kubeconfig")
}

// UserConfig is a rest.Config for a token user of Users. It panics for another.
func (c *Cluster) UserConfig(user string) *rest.Config {
	tok, ok := c.tokens[user]
	if !ok {
		panic(fmt.Sprintf("cluster: unknown user %q", user))
	}
	return &rest.Config{Host: APIServerURL(), BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.CertPEM}, QPS: 50, Burst: 100}
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.etcdURL = client
	args := []string{
		"--name=node", "--data-dir=" + filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=node=" + peer, "--initial-cluster-state=new",
		"--log-outputs=stderr",
	}
	// Debian's etcd 3.4 or the one $ETCD names (newer): pass only the flags it has.
	help, _ := run(ctx, c.bins.etcd, "--help")
	if strings.Contains(help, "--logger ") {
		args = append(args, "--logger=zap")
	}
	if strings.Contains(help, "--unsafe-no-fsync") {
		args = append(args, "--unsafe-no-fsync")
	}
	if c.etcd, err = startProc(c.Dir, "etcd", c.bins.etcd, args, nil); err != nil {
		return err
	}
	return c.etcd.wait(ctx, time.Minute, func(ctx context.Context) error {
		return httpGet(ctx, client+"/health", nil, `"health":"true"`)
	})
}

// apiserverArgs are the apiserver's flags: authorization Node,RBAC with NodeRestriction, the
// client CA, token users, service-account keys, the kubelet client certificate, the Service
// CIDR, and the audit webhook when one is configured.
func (c *Cluster) apiserverArgs(audit *Audit) ([]string, error) {
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=" + NodeIP,
		"--advertise-address=" + NodeIP,
		"--secure-port=" + strconv.Itoa(APIServerPort),
		"--tls-cert-file=" + c.certPath("apiserver.crt"),
		"--tls-private-key-file=" + c.certPath("apiserver.key"),
		"--client-ca-file=" + c.certPath("ca.crt"),
		"--token-auth-file=" + c.certPath("tokens.csv"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.certPath("sa.pub"),
		"--service-account-signing-key-file=" + c.certPath("sa.key"),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate=" + c.certPath("kubelet-client.crt"),
		"--kubelet-client-key=" + c.certPath("kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	}
	if audit != nil {
		policy := filepath.Join(c.Dir, "audit-policy.yaml")
		webhook := filepath.Join(c.Dir, "audit-webhook.kubeconfig")
		if err := os.WriteFile(policy, audit.Policy, 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(webhook, audit.WebhookKubeconfig, 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--audit-policy-file="+policy, "--audit-webhook-config-file="+webhook)
		if audit.BatchMaxWait > 0 {
			args = append(args, "--audit-webhook-batch-max-wait="+audit.BatchMaxWait.String())
		}
		if audit.AdmissionKubeconfig != nil {
			kubeconfig := filepath.Join(c.Dir, "admission.kubeconfig")
			config := filepath.Join(c.Dir, "admission-config.yaml")
			if err := os.WriteFile(kubeconfig, audit.AdmissionKubeconfig, 0o600); err != nil {
				return nil, err
			}
			if err := os.WriteFile(config, []byte(fmt.Sprintf(admissionConfiguration, kubeconfig)), 0o644); err != nil {
				return nil, err
			}
			args = append(args, "--admission-control-config-file="+config)
		}
	}
	return append(args, c.opts.APIServerArgs...), nil
}

// admissionConfiguration gives the ValidatingAdmissionWebhook plugin a kubeconfig (the %s):
// the apiserver's credentials for the webhooks it calls.
const admissionConfiguration = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %s
`

func (c *Cluster) startAPIServer(ctx context.Context) error {
	args, err := c.apiserverArgs(c.opts.Audit)
	if err != nil {
		return err
	}
	if c.apiserver, err = startProc(c.Dir, "kube-apiserver", c.bins.apiserver, args, nil); err != nil {
		return err
	}
	return c.apiserver.wait(ctx, 3*time.Minute, func(ctx context.Context) error {
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}

// SetAudit restarts the apiserver with another audit configuration (nil: none), for instance
// once the Service that receives the events has its ClusterIP, and waits until it is ready.
func (c *Cluster) SetAudit(ctx context.Context, audit *Audit) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	began := time.Now()
	c.apiserver.stop(10 * time.Second)
	c.logf("cluster: kube-apiserver stopped in %s", time.Since(began).Round(10*time.Millisecond))
	c.opts.Audit = audit
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	c.logf("cluster: kube-apiserver ready again after %s", time.Since(began).Round(10*time.Millisecond))
	return nil
}

func (c *Cluster) startControllers(ctx context.Context) error {
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return err
	}
	cmArgs := []string{
		"--kubeconfig=" + c.KubeconfigPath("system:kube-controller-manager"),
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[0]),
		"--leader-elect=false",
		"--use-service-account-credentials",
		"--root-ca-file=" + c.certPath("ca.crt"),
		"--service-account-private-key-file=" + c.certPath("sa.key"),
		"--cluster-name=kubescribe-node",
		"--profiling=false",
	}
	if c.cm, err = startProc(c.Dir, "kube-controller-manager", c.bins.controllerManager, cmArgs, nil); err != nil {
		return err
	}
	schedArgs := []string{
		"--kubeconfig=" + c.KubeconfigPath("system:kube-scheduler"),
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[1]),
		"--leader-elect=false",
		"--profiling=false",
	}
	if c.scheduler, err = startProc(c.Dir, "kube-scheduler", c.bins.scheduler, schedArgs, nil); err != nil {
		return err
	}
	for i, p := range []*proc{c.cm, c.scheduler} {
		url := "https://127.0.0.1:" + strconv.Itoa(ports[i]) + "/healthz"
		if err := p.wait(ctx, 2*time.Minute, func(ctx context.Context) error { return httpGet(ctx, url, nil, "ok") }); err != nil {
			return err
		}
	}
	return nil
}

// kubeletConfig is the KubeletConfiguration: cgroup v1 with cgroupfs, the node's containerd,
// x509 and webhook authentication (no anonymous), webhook authorization, no read-only port,
// an empty resolv.conf, low eviction thresholds, and every directory under the run directory.
func (c *Cluster) kubeletConfig(healthzPort int) string {
	k := filepath.Join(c.Dir, "kubelet")
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[3]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[4]q}
authorization:
  mode: Webhook
resolvConf: %[5]q
clusterDomain: cluster.local
podLogsDir: %[6]q
volumePluginDir: %[7]q
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
  imagefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
failSwapOn: false
serializeImagePulls: false
maxPods: 50
shutdownGracePeriod: 0s
`, c.containerdSocket(), NodeIP, healthzPort, c.certPath("ca.crt"), filepath.Join(k, "resolv.conf"),
		filepath.Join(k, "pod-logs"), filepath.Join(k, "volume-plugins"))
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	k := filepath.Join(c.Dir, "kubelet")
	for _, d := range []string{k, filepath.Join(k, "pod-logs"), filepath.Join(k, "volume-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(k, "resolv.conf"), nil, 0o644); err != nil {
		return err
	}
	ports, err := controlplane.FreePorts(1)
	if err != nil {
		return err
	}
	cfg := filepath.Join(k, "config.yaml")
	if err := os.WriteFile(cfg, []byte(c.kubeletConfig(ports[0])), 0o644); err != nil {
		return err
	}
	args := []string{
		"--config=" + cfg,
		"--kubeconfig=" + c.KubeconfigPath("system:node:"+NodeName),
		"--root-dir=" + filepath.Join(k, "root"),
		"--cert-dir=" + filepath.Join(k, "pki"),
		"--hostname-override=" + NodeName,
		"--node-ip=" + NodeIP,
	}
	if c.kubelet, err = startProc(c.Dir, "kubelet", c.bins.kubelet, args, nil); err != nil {
		return err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/healthz"
	return c.kubelet.wait(ctx, 2*time.Minute, func(ctx context.Context) error { return httpGet(ctx, url, nil, "ok") })
}

// startProxy starts kube-proxy in iptables mode, leaving the host's conntrack settings alone,
// with node ports on the node IP only, and waits until it has synced its rules.
func (c *Cluster) startProxy(ctx context.Context) error {
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + c.KubeconfigPath("system:kube-proxy"),
		"--proxy-mode=iptables",
		"--hostname-override=" + NodeName,
		"--cluster-cidr=" + PodCIDR,
		"--bind-address=" + NodeIP,
		"--nodeport-addresses=" + NodeIP + "/32",
		"--conntrack-max-per-core=0",
		"--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address=127.0.0.1:" + strconv.Itoa(ports[0]),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(ports[1]),
	}
	if c.proxy, err = startProc(c.Dir, "kube-proxy", c.bins.proxy, args, nil); err != nil {
		return err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(ports[0]) + "/healthz"
	return c.proxy.wait(ctx, 2*time.Minute, func(ctx context.Context) error { return httpGet(ctx, url, nil, "") })
}

// httpGet GETs url (TLS unverified: local health endpoints) and wants 200 and want in the body.
func httpGet(ctx context.Context, url string, client *http.Client, want string) error {
	if client == nil {
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		defer client.CloseIdleConnections()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}
