package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// Remote is a second cluster beside a control plane: its own etcd and kube-apiserver, with the
// same CA and token users, whose audit webhook posts to the control plane's audit endpoint
// under another route. It stands for a remote source cluster.
type Remote struct {
	// Route is the {route} its apiserver posts audit events to (/audit/<Route>).
	Route string
	// AdminConfig authenticates as user "admin" (group system:masters) on the remote.
	AdminConfig *rest.Config

	cp       *ControlPlane
	stopOnce sync.Once
	stopErr  error
}

// StartRemote starts a second etcd and kube-apiserver under Dir/remote-<route>, with the
// control plane's CA and token users, the audit webhook pointed at the control plane's audit
// endpoint on /audit/<route>, and waits until the apiserver is ready.
func (cp *ControlPlane) StartRemote(ctx context.Context, route string) (_ *Remote, err error) {
	if !audit.ValidRoute(route) {
		return nil, fmt.Errorf("controlplane: remote route %q is not a DNS label", route)
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cp.Dir, "remote-"+route)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil { // etcd makes its own
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	// The same CA and users: copy the files the apiserver reads.
	for _, name := range []string{"ca.crt", "tokens.csv"} {
		b, err := os.ReadFile(filepath.Join(cp.Dir, "certs", name))
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "certs", name), b, 0o600); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	rcp := &ControlPlane{
		Dir:    dir,
		CA:     cp.CA,
		logf:   cp.logf,
		tokens: cp.tokens,
		apiURL: "https://127.0.0.1:" + strconv.Itoa(ports[2]),
		Audit:  AuditEndpoint{URL: "https://" + cp.Audit.ListenAddr + "/audit/" + route},
		// Its audit client certificate names it (RemoteAuditCertCN): bound to route when
		// Options.RemoteRoutes listed it.
		remoteRoute: route,
	}
	r := &Remote{Route: route, cp: rcp}
	defer func() {
		if err != nil {
			_ = r.Stop()
		}
	}()
	began := time.Now()
	if rcp.etcd, err = rcp.startEtcd(bins.etcd, ports[0], ports[1]); err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	if err := waitReady(ctx, rcp.etcd, etcdReadyTimeout, func(ctx context.Context) error { return etcdHealthy(ctx, etcdURL) }); err != nil {
		return nil, fmt.Errorf("controlplane: remote %s: %w", route, err)
	}
	if rcp.api, err = rcp.startAPIServer(bins.kubeAPIServer, etcdURL, ports[2]); err != nil {
		return nil, err
	}
	r.AdminConfig = rcp.UserConfig("admin")
	if err := waitReady(ctx, rcp.api, apiserverReadyTimeout, func(ctx context.Context) error { return apiserverReady(ctx, r.AdminConfig) }); err != nil {
		return nil, fmt.Errorf("controlplane: remote %s: %w", route, err)
	}
	cp.logf("controlplane: remote kube-apiserver %q ready at %s after %s (audit to %s)", route, rcp.apiURL, time.Since(began).Round(time.Millisecond), rcp.Audit.URL)
	return r, nil
}

// UserConfig returns a rest.Config for a token user (one of Users) on the remote.
func (r *Remote) UserConfig(user string) *rest.Config { return r.cp.UserConfig(user) }

// Kubeconfig returns a kubeconfig for a token user on the remote with everything inline (CA
// data and token), as a GitTarget's kubeconfig Secret holds it.
func (r *Remote) Kubeconfig(user string) ([]byte, error) {
	tok, ok := r.cp.tokens[user]
	if !ok {
		return nil, fmt.Errorf("controlplane: unknown user %q", user)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[r.Route] = &clientcmdapi.Cluster{Server: r.cp.apiURL, CertificateAuthorityData: r.cp.CA.CertPEM}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tok}
	kc.Contexts[r.Route] = &clientcmdapi.Context{Cluster: r.Route, AuthInfo: user}
	kc.CurrentContext = r.Route
	return clientcmd.Write(*kc)
}

// LogPaths lists the remote's etcd and kube-apiserver logs.
func (r *Remote) LogPaths() []string { return r.cp.LogPaths() }

// Stop stops the remote's kube-apiserver, then its etcd. It is idempotent.
func (r *Remote) Stop() error {
	r.stopOnce.Do(func() {
		r.stopErr = errors.Join(r.cp.api.stop(), r.cp.etcd.stop())
	})
	return r.stopErr
}
