// Package cluster brings up a real single-node Kubernetes v1.37.2 on this machine, offline, and
// tears it down leaving the machine as it was: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, the kubelet and kube-proxy (built from k8s.io/kubernetes by `make
// node-binaries`), Debian's containerd and runc with a configuration, root, state and socket
// of their own, the bridge CNI plugin on a bridge of its own, and a pause image built here.
//
// One node per machine: the bridge, its addresses and the apiserver's port are fixed. Start
// needs root. Stop checks the machine against a snapshot taken before the bring-up (processes,
// links, routes, iptables and nftables rules, mounts, cgroups, sysctls, paths) and fails if
// anything is left. docs/testing.md describes it.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

// NodeName is the node's name.
const NodeName = "kubescribe-node"

// Options configure Start.
type Options struct {
	// Dir is the run directory: configuration, data, sockets, logs. Default: a new directory
	// under $TMPDIR, removed by Stop (kept with Keep). containerd's socket lives there, so a
	// short path is best (unix sockets take 107 bytes at most).
	Dir string
	// Keep keeps Dir after Stop, for its logs.
	Keep bool
	// Logf receives progress messages; optional (t.Logf fits).
	Logf func(format string, args ...any)
	// Audit, when set, configures the apiserver's audit webhook; SetAudit changes it later.
	Audit *Audit
	// APIServerArgs are further kube-apiserver flags.
	APIServerArgs []string
}

// Audit is the apiserver's audit webhook configuration.
type Audit struct {
	// Policy is the audit policy (--audit-policy-file).
	Policy []byte
	// WebhookKubeconfig is the webhook's kubeconfig (--audit-webhook-config-file): where to send
	// the events, how to trust that server and how to authenticate to it.
	WebhookKubeconfig []byte
	// BatchMaxWait is --audit-webhook-batch-max-wait; 0 leaves the apiserver's default (30s).
	BatchMaxWait time.Duration
	// AdmissionKubeconfig, when set, is the ValidatingAdmissionWebhook plugin's kubeConfigFile
	// (the apiserver's credentials for admission webhooks), through an AdmissionConfiguration
	// (--admission-control-config-file), as the README's step 3 writes it.
	AdmissionKubeconfig []byte
}

// Cluster is a running node.
type Cluster struct {
	// Dir is the run directory.
	Dir string
	// AdminConfig authenticates as "admin" (system:masters).
	AdminConfig *rest.Config
	// Client is a clientset for AdminConfig.
	Client kubernetes.Interface
	// CA signed the apiserver's certificate and the apiserver's kubelet client certificate, and
	// verifies client certificates (the apiserver's and the kubelet's --client-ca-file).
	CA *controlplane.CA
	// Before is the machine as it was before Start.
	Before *HostState
	// Timings of the bring-up's steps, in order.
	Timings []Timing
	// Leftovers is what Stop found different from Before, one line each (Stop's error lists
	// them too).
	Leftovers []string

	opts    Options
	logf    func(string, ...any)
	bins    binaries
	tokens  map[string]string
	etcdURL string

	mu         sync.Mutex
	containerd *proc
	etcd       *proc
	apiserver  *proc
	cm         *proc
	scheduler  *proc
	kubelet    *proc
	proxy      *proc

	// owner holds Dir's owner lock while this process lives (ownerFile).
	owner *os.File

	stopOnce sync.Once
	stopErr  error
}

// Timing is how long after Start's beginning a step was done.
type Timing struct {
	Step  string
	After time.Duration
}

// Users are the token users besides the components' own: admin (system:masters) and the
// users the tests act as, without any permission until a test grants one.
var Users = []string{"admin", "alice", "bob", "carol", "kubescribe"}

// Start brings the node up and waits until it is Ready, its kube-root-ca.crt and default
// ServiceAccount exist, and the kubelet's changes to the kernel's settings are undone. If it
// fails, it tears down what it started (and says what, if anything, was left).
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("cluster: a node needs root")
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	// A node whose test binary died before Stop (killed, timed out, the machine's processes
	// killed) is torn down first, from its snapshot; a living one is left alone.
	if dirs, err := RecoverAbandoned(); err != nil {
		return nil, fmt.Errorf("cluster: tearing down a node left by a dead test binary (%v): %w", dirs, err)
	} else if len(dirs) > 0 {
		logf("cluster: tore down a node its dead test binary left: %v", dirs)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", Bridge)); err == nil {
		return nil, fmt.Errorf("cluster: the bridge %s exists: another node runs on this machine (a living test binary holds its run directory's %s), or one was left without a run directory under %s (`make cluster-clean DIR=<run directory>` tears it down from its before.json)", Bridge, ownerFile, os.TempDir())
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "kubescribe-node-"); err != nil {
			return nil, err
		}
	} else if opts.Dir, err = filepath.Abs(opts.Dir); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: opts.Dir, opts: opts, logf: logf, bins: bins}
	if c.owner, err = lockOwner(c.Dir); err != nil {
		return nil, err
	} else if c.owner == nil {
		return nil, fmt.Errorf("cluster: %s is another living node's run directory", c.Dir)
	}
	began := time.Now()
	step := func(s string) {
		c.Timings = append(c.Timings, Timing{s, time.Since(began)})
		logf("cluster: %s after %s", s, time.Since(began).Round(10*time.Millisecond))
	}
	if c.Before, err = Snapshot(ctx, c.Dir); err != nil {
		return nil, err
	}
	// Kept for Recover, should this process die before Stop.
	if err := saveSnapshot(c.Before, filepath.Join(c.Dir, beforeFile)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			var logs strings.Builder
			c.DumpLogs(&logs, 40)
			logf("cluster: start failed; the components' logs:\n%s", logs.String())
			if stopErr := c.Stop(); stopErr != nil {
				err = fmt.Errorf("%w\n(and the tear-down: %v)", err, stopErr)
			}
		}
	}()
	if err := os.MkdirAll(filepath.Join(c.Dir, "images"), 0o755); err != nil {
		return nil, err
	}
	if err := setUpNetwork(ctx, c.Before); err != nil {
		return nil, fmt.Errorf("cluster: network: %w", err)
	}
	step("network")
	pause := filepath.Join(c.Dir, "images", "pause.tar")
	if err := BuildGoImage(ctx, GoImage{Name: PauseImage, Package: "./test/cluster/cmd/pause", User: "65535:65535"}, pause); err != nil {
		return nil, fmt.Errorf("cluster: pause image: %w", err)
	}
	if err := c.startContainerd(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.ImportImage(ctx, pause); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	step("containerd ready, pause image imported")
	if err := c.writePKI(); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	step("etcd ready")
	if err := c.startAPIServer(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	step("kube-apiserver ready")
	if err := c.grantAPIServerKubeletAccess(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.startControllers(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.startKubelet(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.startProxy(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	step("node Ready")
	if err := restoreSysctls(c.Before); err != nil {
		return nil, fmt.Errorf("cluster: restore sysctls: %w", err)
	}
	if err := c.waitDefaults(ctx); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	step("default ServiceAccount and kube-root-ca.crt published")
	return c, nil
}

// beforeFile is where Start keeps its snapshot of the machine, in the run directory.
const beforeFile = "before.json"

func saveSnapshot(h *HostState, path string) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Recover tears down a node whose test binary died before Stop (killed, or timed out: its
// components die with it, but not containerd's shims, the bridge, the rules, the mounts, the
// cgroups or the sysctls), from the snapshot Start kept in its run directory dir, and checks the
// machine against it as Stop does.
func Recover(dirs ...string) error {
	var e errs
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, beforeFile))
		if err != nil {
			e.add(fmt.Errorf("cluster: %s: %w", dir, err))
			continue
		}
		var before HostState
		if err := json.Unmarshal(b, &before); err != nil {
			e.add(fmt.Errorf("cluster: %s: %w", dir, err))
			continue
		}
		before.procMark = dir
		owner, err := lockOwner(dir)
		if err != nil {
			e.add(err)
			continue
		}
		if owner == nil {
			e.add(fmt.Errorf("cluster: %s: a living test binary owns this node (it holds %s): stop that one instead", dir, ownerFile))
			continue
		}
		bins, _ := findBinaries() // without kube-proxy, its rules are removed by name only
		c := &Cluster{Dir: dir, Before: &before, bins: bins, logf: func(string, ...any) {}, owner: owner}
		e.add(c.Stop())
	}
	return e.join()
}

// binaries are the programs a node runs.
type binaries struct {
	apiserver, controllerManager, scheduler, kubelet, proxy string
	etcd, containerd, ctr, runc, cniDir                     string
}

// findBinaries finds the Kubernetes binaries in $KUBE_BIN_DIR, else <module root>/bin (where
// `make node-binaries` puts them; $KUBE_APISERVER names the apiserver, as for test/controlplane),
// etcd as $ETCD, else the same directory's (`make etcd`'s v3.7.0), else on PATH, and Debian's
// containerd, ctr, runc and CNI plugins.
func findBinaries() (binaries, error) {
	var b binaries
	dir := os.Getenv("KUBE_BIN_DIR")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			return b, err
		}
		dir = filepath.Join(root, "bin")
	}
	b.apiserver = os.Getenv("KUBE_APISERVER")
	if b.apiserver == "" {
		b.apiserver = filepath.Join(dir, "kube-apiserver")
	}
	b.controllerManager = filepath.Join(dir, "kube-controller-manager")
	b.scheduler = filepath.Join(dir, "kube-scheduler")
	b.kubelet = filepath.Join(dir, "kubelet")
	b.proxy = filepath.Join(dir, "kube-proxy")
	var missing []string
	for _, p := range []string{b.apiserver, b.controllerManager, b.scheduler, b.kubelet, b.proxy} {
		if !fileExists(p) {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("cluster: not built: %s (run `make node-binaries`)", strings.Join(missing, ", "))
	}
	b.etcd = os.Getenv("ETCD")
	if b.etcd == "" && fileExists(filepath.Join(dir, "etcd")) {
		b.etcd = filepath.Join(dir, "etcd")
	}
	for _, x := range []struct {
		name string
		dst  *string
	}{{"etcd", &b.etcd}, {"containerd", &b.containerd}, {"ctr", &b.ctr}, {"runc", &b.runc}, {"ip", new(string)}, {"iptables", new(string)}} {
		if *x.dst != "" {
			continue
		}
		p, err := exec.LookPath(x.name)
		if err != nil {
			return b, fmt.Errorf("cluster: %s not found (run `make deps`: it installs containerd, runc, containernetworking-plugins, iptables): %w", x.name, err)
		}
		*x.dst = p
	}
	b.cniDir = "/usr/lib/cni"
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if !fileExists(filepath.Join(b.cniDir, p)) {
			return b, fmt.Errorf("cluster: CNI plugin %s not in %s (apt-get install containernetworking-plugins)", p, b.cniDir)
		}
	}
	return b, nil
}

// ModuleRoot is the kubescribe module's root (the repository), found as the control plane
// finds it (controlplane.ModuleRoot): builds made with -trimpath know no source path.
func ModuleRoot() (string, error) { return moduleRoot() }

func moduleRoot() (string, error) { return controlplane.ModuleRoot() }

// Stop tears the node down and checks the machine against Before: it returns an error naming
// everything left. It is idempotent.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		began := time.Now()
		var e errs
		c.mu.Lock()
		defer c.mu.Unlock()

		// No controller may re-create what goes now.
		c.cm.stop(5 * time.Second)
		c.scheduler.stop(5 * time.Second)
		if c.kubelet.running() && c.apiserver.running() {
			if err := c.deletePods(ctx); err != nil {
				c.logf("cluster: tear-down: %v (containers are removed through containerd)", err)
			}
		}
		c.proxy.stop(5 * time.Second)
		c.kubelet.stop(10 * time.Second)
		if c.containerd.running() {
			e.add(c.removeContainers(ctx))
		}
		c.containerd.stop(10 * time.Second)
		c.apiserver.stop(5 * time.Second)
		c.etcd.stop(5 * time.Second)
		// Shims and containers outlive containerd; nothing of the node may.
		e.add(killOwn(c.Dir))

		var cleanup func(context.Context) error
		if fileExists(c.bins.proxy) {
			cleanup = func(ctx context.Context) error {
				_, err := run(ctx, c.bins.proxy, "--cleanup")
				return err
			}
		}
		if c.Before != nil {
			e.add(tearDownNetwork(ctx, c.Before, cleanup))
		}
		e.add(unmountBelow(c.Dir))
		e.add(removeCNIResults())
		if c.Before != nil {
			e.add(removeCgroups(c.Before))
			e.add(restoreSysctls(c.Before))
			e.add(removeNewPaths(c.Before, c.Dir))
		}
		if !c.opts.Keep {
			e.add(os.RemoveAll(c.Dir))
		} else if e.join() == nil {
			// Torn down: a kept directory is logs only, nothing for a recovery to find.
			e.add(os.Remove(filepath.Join(c.Dir, beforeFile)))
		}
		if c.owner != nil {
			c.owner.Close()
		}
		c.logf("cluster: torn down in %s", time.Since(began).Round(10*time.Millisecond))
		if c.Before != nil {
			after, err := Snapshot(ctx, c.Dir)
			if err != nil {
				e.add(err)
			} else {
				if c.Leftovers = c.Before.Diff(after); len(c.Leftovers) > 0 {
					e.add(fmt.Errorf("cluster: the machine is not as it was:\n  %s", strings.Join(c.Leftovers, "\n  ")))
				}
				if m := c.Before.NewModules(after); len(m) > 0 {
					c.logf("cluster: kernel modules loaded meanwhile (left loaded): %s", strings.Join(m, " "))
				}
			}
		}
		c.stopErr = e.join()
	})
	return c.stopErr
}

// deletePods deletes every pod (grace 1s) and waits until the kubelet has stopped them and
// removed their network and volumes (the API forgets a pod only then).
func (c *Cluster) deletePods(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	grace := int64(1)
	for _, p := range pods.Items {
		err := c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	for {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			n := -1
			if pods != nil {
				n = len(pods.Items)
			}
			return fmt.Errorf("%d pods still there: %w", n, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// killOwn kills every process that carries dir on its command line or runs in a kubepods
// cgroup, and waits until they are gone.
func killOwn(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs := ownProcs(dir)
		if len(procs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes left: %s", strings.Join(procs, "; "))
		}
		for _, p := range procs {
			pid, _ := strconv.Atoi(strings.Fields(p)[0])
			if pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// unmountBelow unmounts every mount point under dir (pod volumes, sandboxes' /dev/shm, network
// namespaces, overlay roots), deepest first.
func unmountBelow(dir string) error {
	ms, err := mounts()
	if err != nil {
		return err
	}
	var below []string
	for _, m := range ms {
		p := m[:strings.LastIndex(m, " ")]
		if p == dir || strings.HasPrefix(p, dir+"/") {
			below = append(below, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(below)))
	var e errs
	for _, p := range below {
		if err := syscall.Unmount(p, 0); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				e.add(fmt.Errorf("unmount %s: %w", p, err))
			}
		}
	}
	return e.join()
}

// removeCgroups removes the kubelet's kubepods hierarchy (and anything below it) from every
// cgroup hierarchy where it did not exist before, deepest first.
func removeCgroups(before *HostState) error {
	ms, err := mounts()
	if err != nil {
		return err
	}
	var e errs
	for _, m := range ms {
		f := strings.Fields(m)
		if f[1] != "cgroup" && f[1] != "cgroup2" {
			continue
		}
		for _, top := range []string{"kubepods", "kubepods.slice"} {
			root := filepath.Join(f[0], top)
			if !fileExists(root) || containsString(before.Cgroups, root) {
				continue
			}
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
			for _, d := range dirs {
				var err error
				for try := 0; try < 20; try++ {
					if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
						err = nil
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if err != nil {
					e.add(fmt.Errorf("rmdir %s: %w", d, err))
				}
			}
		}
	}
	return e.join()
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// cniResults is where libcni caches the result of each ADD until its DEL: a fixed path.
const cniResults = "/var/lib/cni/results"

// removeCNIResults removes libcni's cached results of the node's network (and of containerd's
// loopback for the same sandboxes), which a DEL that never came (the kubelet or containerd
// killed) leaves behind.
func removeCNIResults() error {
	es, err := os.ReadDir(cniResults)
	if err != nil {
		return nil
	}
	var e errs
	prefix := cniNetwork + "-"
	for _, x := range es {
		name := x.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		// <network>-<container id>-<interface>
		id := strings.TrimPrefix(name, prefix)
		if i := strings.LastIndex(id, "-"); i > 0 {
			id = id[:i]
		}
		e.add(os.Remove(filepath.Join(cniResults, name)))
		if err := os.Remove(filepath.Join(cniResults, "cni-loopback-"+id+"-lo")); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.add(err)
		}
	}
	return e.join()
}

// removeNewPaths removes, of the hostPaths that did not exist before, the empty directories, the
// symbolic links into dir (the kubelet's /var/log/containers links) and the sockets nothing
// listens on any more (the kubelet's device-plugin socket, which is always
// /var/lib/kubelet/device-plugins/kubelet.sock; containerd's shims' in /run/containerd/s),
// deepest first. Anything else there is not the node's alone (a live socket of another
// containerd's shim, say): it stays, and the check names it.
func removeNewPaths(before *HostState, dir string) error {
	var e errs
	for _, p := range hostPaths {
		if containsString(before.Paths, p) {
			continue
		}
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		var entries []string
		_ = filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
			if err == nil {
				entries = append(entries, path)
			}
			return nil
		})
		sort.Sort(sort.Reverse(sort.StringSlice(entries)))
		for _, x := range entries {
			fi, err := os.Lstat(x)
			if err != nil {
				continue
			}
			switch {
			case fi.IsDir():
				_ = syscall.Rmdir(x) // fails if something else is in it
			case fi.Mode()&os.ModeSymlink != 0:
				if target, err := os.Readlink(x); err == nil && strings.HasPrefix(target, dir+"/") {
					e.add(os.Remove(x))
				}
			case fi.Mode()&os.ModeSocket != 0:
				if conn, err := net.DialTimeout("unix", x, time.Second); err == nil {
					conn.Close()
				} else if errors.Is(err, syscall.ECONNREFUSED) {
					e.add(os.Remove(x))
				}
			}
		}
	}
	return e.join()
}

// waitNodeReady waits until the node is registered and Ready.
func (c *Cluster) waitNodeReady(ctx context.Context) error {
	return c.kubelet.wait(ctx, 3*time.Minute, func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node not Ready: %s: %s", cond.Reason, cond.Message)
			}
		}
		return errors.New("node has no Ready condition yet")
	})
}

// waitDefaults waits for what every pod needs from the controller-manager: the default
// ServiceAccount and the kube-root-ca.crt ConfigMap in "default".
func (c *Cluster) waitDefaults(ctx context.Context) error {
	return c.cm.wait(ctx, 2*time.Minute, func(ctx context.Context) error {
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := c.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
}

// grantAPIServerKubeletAccess lets the apiserver's kubelet client (logs, exec, port-forward)
// through the kubelet's webhook authorization.
func (c *Cluster) grantAPIServerKubeletAccess(ctx context.Context) error {
	_, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-client"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: kubeletClientCN}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// LogPaths lists the components' logs.
func (c *Cluster) LogPaths() []string {
	ps, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	return ps
}

// DumpLogs writes the last n lines of every log to w.
func (c *Cluster) DumpLogs(w io.Writer, n int) {
	for _, p := range c.LogPaths() {
		fmt.Fprintln(w, tail(p, n))
	}
}

// RSS is the resident memory of the node's processes (components, shims, containers), in
// bytes, by command name.
func (c *Cluster) RSS() map[string]int64 {
	rss := map[string]int64{}
	for _, p := range ownProcs(c.Dir) {
		pid := strings.Fields(p)[0]
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			continue
		}
		var name string
		var kb int64
		for _, l := range strings.Split(string(status), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) >= 2 && f[0] == "Name:":
				name = f[1]
			case len(f) >= 2 && f[0] == "VmRSS:":
				kb, _ = strconv.ParseInt(f[1], 10, 64)
			}
		}
		rss[name] += kb * 1024
	}
	return rss
}
