package git

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkFolderCheck: the writer's check of a 100,000-file folder (the whole fixture, laid
// out as kubescribe writes) right after a start, whose working store holds no blobs.
// baseline-full-fetch is a server that refuses blob ids: one depth-1 fetch of the tip with
// every blob. kubescribe-blob-batches fetches the manifests by id, a batch at a time.
// peak-heap-MiB is the largest heap in use sampled (every millisecond) during one check, and
// check-heap-MiB what the check added to the heap in use before it (the working store of the
// 100,000-file tip, the benchmark's fixtures).
func BenchmarkFolderCheck(b *testing.B) {
	const files = 100_000
	for _, byID := range []bool{false, true} {
		name := "baseline-full-fetch"
		if byID {
			name = "kubescribe-blob-batches"
		}
		b.Run(name, func(b *testing.B) {
			srv, url, gitDir := pushSetup(b, files)
			runGit(b, "", "--git-dir="+gitDir, "config", "uploadpack.allowAnySHA1InWant", strconv.FormatBool(byID))
			ctx := context.Background()
			w := benchWorker(b, url, srv.ca)
			require.NoError(b, w.open(ctx))
			require.NoError(b, w.rebuild())
			tree, err := w.builder().dirAt(w.localTip, "")
			require.NoError(b, err)
			var peak, added uint64
			for b.Loop() {
				base, p := peakHeap(func() {
					if err := w.scanFolder(ctx, tree, ""); err != nil {
						b.Fatal(err)
					}
				})
				peak, added = max(peak, p), max(added, p-min(p, base))
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(added)/(1<<20), "check-heap-MiB")
		})
	}
}

// peakHeap runs f and returns the HeapInuse before it and the largest sampled while it ran.
func peakHeap(f func()) (base, peak uint64) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var max atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var ms runtime.MemStats
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > max.Load() {
				max.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	f()
	close(done)
	<-stopped
	return before.HeapInuse, max.Load()
}
