//go:build exportbench

package e2e

// The export measurement: 10,000 objects in the real apiserver, exported by the real CLI. It is
// not part of `make test` (build tag exportbench); run it by hand:
//
//	KUBE_APISERVER=$PWD/bin/kube-apiserver go test -tags exportbench -count=1 -timeout 30m \
//	    -run TestExportBench -v ./test/e2e/
//
// It reports objects/s and the CLI's peak RSS for the default run (pages of 500, 4 resources at
// once) beside a baseline run that reads each list in a single page, so the effect of paging on
// memory shows as a ratio on the same machine.

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	benchNamespaces = 10
	benchConfigMaps = 600 // per namespace
	benchAccounts   = 400 // per namespace
)

func TestExportBench(t *testing.T) {
	ctx := context.Background()
	cfg := rest.CopyConfig(env.AdminConfig)
	cfg.QPS, cfg.Burst = 2000, 4000
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	payload := strings.Repeat("x", 1024)
	type job struct {
		ns, name string
		cm       bool
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				var err error
				if j.cm {
					_, err = kube.CoreV1().ConfigMaps(j.ns).Create(ctx, &corev1.ConfigMap{
						ObjectMeta: metav1.ObjectMeta{Name: j.name, Labels: map[string]string{"bench": "export"}},
						Data:       map[string]string{"payload": payload, "index": j.name},
					}, metav1.CreateOptions{})
				} else {
					_, err = kube.CoreV1().ServiceAccounts(j.ns).Create(ctx, &corev1.ServiceAccount{
						ObjectMeta: metav1.ObjectMeta{Name: j.name, Labels: map[string]string{"bench": "export"}},
					}, metav1.CreateOptions{})
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for n := range benchNamespaces {
		ns := fmt.Sprintf("e2e-bench-%02d", n)
		createNamespace(t, ns)
		for i := range benchConfigMaps {
			jobs <- job{ns: ns, name: fmt.Sprintf("cm-%04d", i), cm: true}
		}
		for i := range benchAccounts {
			jobs <- job{ns: ns, name: fmt.Sprintf("sa-%04d", i)}
		}
	}
	close(jobs)
	wg.Wait()
	require.NoError(t, firstErr)
	total := benchNamespaces * (benchConfigMaps + benchAccounts)
	t.Logf("created %d objects", total)

	rate := regexp.MustCompile(`exported (\d+) objects .* \((\d+) objects/s\)`)
	measure := func(name string, extra ...string) (objects, perSecond int, rssMiB float64) {
		dir := filepath.Join(t.TempDir(), name)
		args := append([]string{"--api-groups", "", "--resources", "configmaps,serviceaccounts", "--progress", "never"}, extra...)
		r := exportAsAdmin(t, append(args, dir)...)
		m := rate.FindStringSubmatch(r.stdout)
		require.NotNil(t, m, r.stdout)
		objects, _ = strconv.Atoi(m[1])
		perSecond, _ = strconv.Atoi(m[2])
		return objects, perSecond, float64(r.maxRSSKiB) / 1024
	}
	// Warm up the apiserver's caches once, then measure each variant.
	measure("warmup")
	for _, v := range []struct {
		name  string
		extra []string
	}{
		{"default (pages of 500, 4 at once)", nil},
		{"baseline (one page per list)", []string{"--page-size", "1000000"}},
		{"sequential (pages of 500, 1 at once)", []string{"--concurrency", "1"}},
	} {
		objects, perSecond, rss := measure(strings.Fields(v.name)[0], v.extra...)
		require.GreaterOrEqual(t, objects, total)
		t.Logf("%-40s %6d objects  %6d objects/s  peak RSS %6.1f MiB", v.name, objects, perSecond, rss)
	}
}
