package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/test/cluster"
	"github.com/kubescribe/kubescribe/test/deploy"
	"github.com/kubescribe/kubescribe/test/stack"
)

// redisClusterIP is the ClusterIP the test gives kubescribe's Redis Service: the node has no
// cluster DNS (yet), so kubescribe is pointed at the address instead of kubescribe-redis. It
// lies in the range's lower band, which the apiserver hands out dynamically only once the upper
// band is full (the first 16 addresses of a /24: min(max(16, size/16), 256), KEP-3070, as
// kubernetes.io's "Service ClusterIP allocation" page says); 10.96.0.20 was in the upper band,
// and once a Service created before it (kubescribe's own) had been given that address.
const redisClusterIP = "10.96.0.12"

// quickstart installs deploy/overlays/quickstart as `kubectl apply -k` would, built with
// kustomize's library in a copy of deploy/ under dir, with the image `make image` built
// (bin/kubescribe-image.tar, or $KUBESCRIBE_IMAGE) imported and named by an images: override,
// Redis from BuildRedisImage, credentials from deploy/secrets.sh (left in dir's copy, where the
// later steps read them as a user reads secrets/), and waits until Redis and kubescribe are
// Ready, running as their own ServiceAccounts. What the overlay is given besides: a
// PersistentVolume for Redis' claim (the node has no provisioner), and the Redis address as an
// IP (no DNS).
func quickstart(ctx context.Context, t *testing.T, c *cluster.Cluster, dir string) {
	root, err := cluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	archive := os.Getenv("KUBESCRIBE_IMAGE")
	if archive == "" {
		archive = filepath.Join(root, "bin", "kubescribe-image.tar")
	}
	if _, err := os.Stat(archive); err != nil {
		t.Skipf("kubescribe's image: %v (run `make image`; make cluster-test does)", err)
	}
	began := time.Now()
	if err := c.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	redis := filepath.Join(t.TempDir(), "redis.tar")
	if err := cluster.BuildRedisImage(ctx, redis); err != nil {
		t.Fatal(err)
	}
	if err := c.ImportImage(ctx, redis); err != nil {
		t.Fatal(err)
	}
	images, _ := c.Images(ctx)
	t.Logf("images imported in %s: %s", time.Since(began).Round(100*time.Millisecond), strings.Join(images, " "))

	redisPV(ctx, t, c)
	applyOverlay(ctx, t, c, root, dir, "quickstart")

	const ns = "kubescribe"
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kubescribe"})
	if err != nil || len(pods.Items) != 2 {
		t.Fatalf("kubescribe's pods: want the Deployment's two, have %d (%v)", len(pods.Items), err)
	}
	for _, p := range pods.Items {
		if p.Spec.ServiceAccountName != "kubescribe" || p.Status.ContainerStatuses[0].ImageID == "" {
			t.Errorf("kubescribe Pod %s runs as %q, image %q", p.Name, p.Spec.ServiceAccountName, p.Status.ContainerStatuses[0].ImageID)
		}
	}
	p := pods.Items[0]
	t.Logf("kubescribe runs as two Pods of ServiceAccount %s/%s, image %s (%s)", ns, p.Spec.ServiceAccountName,
		p.Status.ContainerStatuses[0].Image, p.Status.ContainerStatuses[0].ImageID)
}

// applyOverlay builds deploy/overlays/<overlay> (with the test's overrides of
// testKustomization) in dir's copy of deploy/, applies it, and waits until Redis is
// Ready and kubescribe's Deployment has rolled out.
func applyOverlay(ctx context.Context, t *testing.T, c *cluster.Cluster, root, dir, overlay string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "overlays", overlay, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applyKustomization(ctx, t, c, root, dir, overlay, b)
}

// applyKustomization is applyOverlay for an overlay named overlay whose kustomization.yaml is
// kustomization (one of docs/install.md's, written next to deploy/overlays/*).
func applyKustomization(ctx context.Context, t *testing.T, c *cluster.Cluster, root, dir, overlay string, kustomization []byte) {
	t.Helper()
	objs, err := deploy.BuildOverlay(root, dir, overlay, testKustomization(t, kustomization))
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, o := range objs {
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		all.WriteString("---\n")
		all.Write(b)
	}
	began := time.Now()
	if err := stack.Apply(ctx, c.AdminConfig, []byte(all.String())); err != nil {
		t.Fatal(err)
	}
	t.Logf("applied %d objects of %s", len(objs), overlay)

	const ns = "kubescribe"
	poll(ctx, t, 3*time.Minute, "StatefulSet kubescribe-redis ready", func() error {
		s, err := c.Client.AppsV1().StatefulSets(ns).Get(ctx, "kubescribe-redis", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Status.ReadyReplicas != 1 || s.Status.UpdatedReplicas != 1 || s.Status.ObservedGeneration != s.Generation {
			return fmt.Errorf("%d ready, %d updated", s.Status.ReadyReplicas, s.Status.UpdatedReplicas)
		}
		return nil
	})
	t.Logf("Redis Ready %s after the apply", time.Since(began).Round(100*time.Millisecond))
	waitRolledOut(ctx, t, c)
	t.Logf("kubescribe Ready %s after the apply", time.Since(began).Round(100*time.Millisecond))
}

// waitRolledOut waits as `kubectl rollout status deployment/kubescribe` does: the newest
// generation observed, each of its replicas updated and Ready, no other replica left.
func waitRolledOut(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	poll(ctx, t, 4*time.Minute, "Deployment kubescribe rolled out", func() error {
		if done, err := rolledOut(ctx, c); done || err != nil {
			return err
		}
		return errors.New("not rolled out")
	})
}

// rolledOut reports whether the Deployment kubescribe is rolled out (waitRolledOut); the error
// says how it stands when it is not.
func rolledOut(ctx context.Context, c *cluster.Cluster) (bool, error) {
	d, err := c.Client.AppsV1().Deployments("kubescribe").Get(ctx, "kubescribe", metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	s, want := d.Status, ptr.Deref(d.Spec.Replicas, 1)
	if s.ObservedGeneration != d.Generation || s.UpdatedReplicas != want || s.ReadyReplicas != want || s.Replicas != want {
		return false, fmt.Errorf("generation %d observed %d, %d of %d updated, %d ready, %d in all, conditions %v",
			d.Generation, s.ObservedGeneration, s.UpdatedReplicas, want, s.ReadyReplicas, s.Replicas, s.Conditions)
	}
	return true, nil
}

// testKustomization is the kustomization.yaml b with an images: override to the local images,
// and the Redis Service's ClusterIP fixed and given to kubescribe as its Redis address.
func testKustomization(t *testing.T, b []byte) []byte {
	t.Helper()
	var k map[string]any
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	add := func(key string, items ...any) {
		list, _ := k[key].([]any)
		k[key] = append(list, items...)
	}
	name, tag, _ := strings.Cut(cluster.RedisImage, ":")
	add("images",
		map[string]any{"name": "kubescribe", "newName": "docker.io/library/kubescribe", "newTag": "dev"},
		map[string]any{"name": "redis", "newName": name, "newTag": tag})
	add("configMapGenerator", map[string]any{
		"name": "kubescribe", "namespace": "kubescribe", "behavior": "merge",
		"literals": []any{"redis-addr=" + redisClusterIP + ":6379"},
	})
	add("patches", map[string]any{
		"target": map[string]any{"kind": "Service", "name": "kubescribe-redis"},
		"patch":  "- op: add\n  path: /spec/clusterIP\n  value: " + redisClusterIP + "\n",
	})
	out, err := yaml.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// redisPV makes a PersistentVolume for the Redis StatefulSet's claim (1Gi, ReadWriteOnce, no
// class: it binds to a claim without one when there is no default StorageClass), a directory
// of the run directory owned by Redis' user.
func redisPV(ctx context.Context, t *testing.T, c *cluster.Cluster) {
	t.Helper()
	dir := filepath.Join(c.Dir, "volumes", "redis-data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 999, 999); err != nil {
		t.Fatal(err)
	}
	_, err := c.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "kubescribe-redis-data"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// describePods logs the pods of ns with their conditions, container states and last log lines.
func describePods(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("pods of %s: %v", ns, err)
		return
	}
	for _, p := range pods.Items {
		t.Logf("pod %s: phase %s, conditions %+v", p.Name, p.Status.Phase, p.Status.Conditions)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			t.Logf("  container %s: ready %v, restarts %d, state %+v, last %+v", cs.Name, cs.Ready, cs.RestartCount, cs.State, cs.LastTerminationState)
			tail := int64(80)
			logs, err := c.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: &tail}).DoRaw(ctx)
			t.Logf("  log of %s: %v\n%s", cs.Name, err, logs)
		}
	}
	evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}
