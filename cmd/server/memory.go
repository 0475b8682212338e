package main

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// After a burst of work (a snapshot, a stream of commits) the heap holds the burst's garbage
// until the next collection, and with no allocation that is the runtime's periodic one, two
// minutes later; the background scavenger then returns the free pages to the OS slowly. The
// process would stay resident at its burst size for minutes. Once a burst has ended (the
// process allocated at least burstBytes since the last release, then at most quietBytes per
// interval for quietIntervals intervals in a row), debug.FreeOSMemory collects once and returns
// every free page at once. That costs one full collection per burst, measured at ~40-90ms of
// CPU with a 40 MB live heap (docs/operations.md, "Memory"); a steady load never pauses long
// enough to pay it more often than once per burstBytes allocated.
const (
	releaseInterval       = 5 * time.Second
	releaseQuietBytes     = 4 << 20
	releaseQuietIntervals = 2
	releaseBurstBytes     = 64 << 20
)

// burstReleaser decides when a burst has ended. It is driven by step, once per interval, with
// the bytes allocated during that interval.
type burstReleaser struct {
	quietBytes     uint64
	quietIntervals int
	burstBytes     uint64
	release        func()

	since uint64 // bytes allocated since the last release (or the start)
	calm  int    // quiet intervals in a row
}

func newBurstReleaser(release func()) *burstReleaser {
	return &burstReleaser{
		quietBytes:     releaseQuietBytes,
		quietIntervals: releaseQuietIntervals,
		burstBytes:     releaseBurstBytes,
		release:        release,
	}
}

// step accounts for one interval in which allocated bytes were allocated and reports whether
// it released memory.
func (r *burstReleaser) step(allocated uint64) bool {
	r.since += allocated
	if allocated > r.quietBytes {
		r.calm = 0
		return false
	}
	r.calm++
	if r.calm < r.quietIntervals || r.since < r.burstBytes {
		return false
	}
	r.release()
	r.since, r.calm = 0, 0
	return true
}

// heapAllocsMetric is the cumulative count of bytes allocated on the heap; reading it does not
// stop the world (runtime.ReadMemStats does).
const heapAllocsMetric = "/gc/heap/allocs:bytes"

func heapAllocated(sample []metrics.Sample) uint64 {
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

// releaseAfterBursts returns memory to the OS after each burst of allocation until ctx ends.
func releaseAfterBursts(ctx context.Context, log *slog.Logger) {
	sample := []metrics.Sample{{Name: heapAllocsMetric}}
	r := newBurstReleaser(func() {
		began := time.Now()
		debug.FreeOSMemory()
		log.Debug("returned free memory to the OS after a burst", "took", time.Since(began))
	})
	last := heapAllocated(sample)
	t := time.NewTicker(releaseInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := heapAllocated(sample)
		r.step(now - last)
		last = now
	}
}
