package main

import (
	"runtime/metrics"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBurstReleaserReleasesOnceABurstEnded(t *testing.T) {
	released := 0
	r := newBurstReleaser(func() { released++ })
	const mib = 1 << 20

	// A quiet process never releases, however long it runs: it allocates little in total.
	for range 10 {
		require.False(t, r.step(1*mib))
	}
	require.Zero(t, released)

	// A burst: nothing is released while it lasts.
	for range 20 {
		require.False(t, r.step(100*mib))
	}
	// It ends: the first quiet interval may be a pause inside the burst, the second releases.
	require.False(t, r.step(0))
	require.True(t, r.step(0))
	require.Equal(t, 1, released)

	// Staying quiet releases nothing more.
	for range 50 {
		require.False(t, r.step(1*mib))
	}
	require.Equal(t, 1, released)

	// A short pause inside the next burst does not release; the burst's end does.
	require.False(t, r.step(200*mib))
	require.False(t, r.step(0))
	require.False(t, r.step(200*mib))
	require.False(t, r.step(0))
	require.True(t, r.step(0))
	require.Equal(t, 2, released)
}

func TestBurstReleaserCountsSmallLoadsTowardsABurst(t *testing.T) {
	// A trickle below the quiet threshold still adds up: once it reached a burst's worth of
	// allocation, the next quiet stretch releases.
	released := 0
	r := newBurstReleaser(func() { released++ })
	for range 16 {
		r.step(releaseQuietBytes)
	}
	require.Equal(t, 1, released)
}

func TestHeapAllocatedGrows(t *testing.T) {
	sample := []metrics.Sample{{Name: heapAllocsMetric}}
	before := heapAllocated(sample)
	require.NotZero(t, before)
	keep := make([][]byte, 0, 64)
	for range 64 {
		keep = append(keep, make([]byte, 64<<10))
	}
	require.Len(t, keep, 64)
	require.GreaterOrEqual(t, heapAllocated(sample)-before, uint64(64*64<<10))
}
