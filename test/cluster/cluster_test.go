package cluster_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubescribe/kubescribe/test/cluster"
)

// requireNode skips unless this run may bring a node up: root, not -short, and
// KUBESCRIBE_NODE=1 (make cluster-test sets it), so that `go test ./...` next to the other
// packages' tests does not start one by surprise.
func requireNode(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a real node: not with -short")
	}
	if os.Getenv("KUBESCRIBE_NODE") == "" {
		t.Skip("a real node: run `make cluster-test` (or set KUBESCRIBE_NODE=1)")
	}
	if os.Geteuid() != 0 {
		t.Skip("a real node needs root")
	}
}

// TestNode brings a node up, runs a pod of an image built here behind a ClusterIP Service,
// reaches it from the host, follows the README's quickstart on it (kubescribe installed with
// deploy/overlays/quickstart, the apiserver wired to it, changes mirrored and authored, a
// rollout restart, a CommitRequest, then the managed overlay), and tears the node down: Stop
// fails if anything is left on the machine.
func TestNode(t *testing.T) {
	requireNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	began := time.Now()
	// KUBESCRIBE_NODE_KEEP=1 keeps the run directory (logs, configuration) after the test.
	c, err := cluster.Start(ctx, cluster.Options{Logf: t.Logf, Keep: os.Getenv("KUBESCRIBE_NODE_KEEP") != ""})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bring-up: %s", time.Since(began).Round(100*time.Millisecond))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			if t.Failed() {
				c.DumpLogs(os.Stderr, 60)
			}
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("smoke", func(t *testing.T) { smoke(ctx, t, c) })
	logRSS(t, c)
	// The README's quickstart as a user follows it, each step on what the one before left;
	// a step that failed skips the rest.
	dir := t.TempDir()
	u := newUser(t, c, dir)
	steps := []struct {
		name string
		f    func(context.Context, *testing.T, *user)
	}{
		{"quickstart", func(ctx context.Context, t *testing.T, u *user) { quickstart(ctx, t, c, dir) }},
		{"apiserver wired", wireAPIServer},
		{"mirror", mirror},
		{"rollout restart", rolloutRestart},
		{"commit request", commitRequest},
		{"doctor", doctor},
		{"secret authors", secretAuthors},
		{"managed", managed},
		{"managed secrets", managedSecrets},
	}
	failed := ""
	for _, s := range steps {
		ok := t.Run(s.name, func(t *testing.T) {
			if failed != "" {
				t.Skipf("step %q failed", failed)
			}
			defer func() {
				if t.Failed() {
					describePods(ctx, t, c, "kubescribe")
				}
			}()
			s.f(ctx, t, u)
		})
		if !ok && failed == "" {
			failed = s.name
		}
		logRSS(t, c)
	}
	// The kubelet rewrote these at its start; Start put them back, and they must stay so.
	for _, k := range []string{"kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory"} {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		if err != nil {
			t.Fatal(err)
		}
		if now := strings.TrimSpace(string(b)); now != c.Before.Sysctls[k] {
			t.Errorf("sysctl %s = %s while the node runs, was %s", k, now, c.Before.Sysctls[k])
		}
	}

	if t.Failed() {
		c.DumpLogs(os.Stderr, 60)
	}
	// A link the tear-down knows nothing of must show up in its check, and be all it finds.
	const leak = "ksleak0"
	if out, err := exec.Command("ip", "link", "add", leak, "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("ip link add %s: %v: %s", leak, err, out)
	}
	defer exec.Command("ip", "link", "del", leak).Run()
	began = time.Now()
	err = c.Stop()
	stopped = true
	t.Logf("tear-down and check: %s", time.Since(began).Round(100*time.Millisecond))
	if want := []string{"link left: " + leak}; !slices.Equal(c.Leftovers, want) {
		t.Fatalf("the tear-down's check found %q, want %q (error: %v)", c.Leftovers, want, err)
	}
	if out, err := exec.Command("ip", "link", "del", leak).CombinedOutput(); err != nil {
		t.Fatalf("ip link del %s: %v: %s", leak, err, out)
	}
	after, err := cluster.Snapshot(ctx, c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Before.Diff(after); len(d) > 0 {
		t.Fatalf("the machine is not as it was:\n%s", strings.Join(d, "\n"))
	}
}

// smoke runs cmd/hello as a pod from an image imported with ctr (imagePullPolicy Never),
// waits until it is Ready, and reaches it from the host through its ClusterIP and its pod IP;
// it reads the pod's log through the apiserver (apiserver to kubelet).
func smoke(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	const image = "kubescribe.test/hello:1"
	archive := filepath.Join(t.TempDir(), "hello.tar")
	if err := cluster.BuildGoImage(ctx, cluster.GoImage{Name: image, Package: "./test/cluster/cmd/hello", User: "65532:65532"}, archive); err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	ns := "smoke"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "hello"}
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")}
	nonRoot, noEscalation := true, false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Labels: labels},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:            "hello",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
					PeriodSeconds: 1,
				},
				Resources: corev1.ResourceRequirements{Limits: limits, Requests: limits},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: &nonRoot, AllowPrivilegeEscalation: &noEscalation,
					ReadOnlyRootFilesystem: &nonRoot,
					Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var podIP string
	poll(ctx, t, 2*time.Minute, "pod hello Ready", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				podIP = p.Status.PodIP
				return nil
			}
		}
		return fmt.Errorf("phase %s, conditions %v, containers %v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	})
	t.Logf("pod Ready %s after its creation, IP %s", time.Since(began).Round(100*time.Millisecond), podIP)

	want := "hello from hello"
	for _, url := range []string{
		"http://" + net.JoinHostPort(podIP, "8080") + "/",
		"http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/",
	} {
		poll(ctx, t, time.Minute, "GET "+url, func() error {
			body, err := get(ctx, url)
			if err != nil {
				return err
			}
			if !strings.Contains(body, want) {
				return fmt.Errorf("answer %q, want %q", body, want)
			}
			return nil
		})
		t.Logf("GET %s: %q", url, want)
	}

	logs, err := c.Client.CoreV1().Pods(ns).GetLogs("hello", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pod log through the apiserver: %v", err)
	}
	if !strings.Contains(string(logs), "serving on :8080") {
		t.Errorf("pod log: %q", logs)
	}
}

func get(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// poll calls f every 500ms until it returns nil, failing the test after timeout.
func poll(ctx context.Context, t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func logRSS(t *testing.T, c *cluster.Cluster) {
	rss := c.RSS()
	names := make([]string, 0, len(rss))
	var total int64
	for n, b := range rss {
		names = append(names, n)
		total += b
	}
	sort.Slice(names, func(i, j int) bool { return rss[names[i]] > rss[names[j]] })
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, rss[n]>>20))
	}
	t.Logf("RSS %d MiB in all (MiB: %s)", total>>20, strings.Join(parts, ", "))
}
