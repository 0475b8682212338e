package notify

import (
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSetSignalsOnceForManyMarks(t *testing.T) {
	s := NewSet[string]()
	s.Mark("a", "b")
	s.Mark("b", "c")
	select {
	case <-s.C():
	default:
		t.Fatal("no signal after marks")
	}
	got := s.Take()
	slices.Sort(got)
	require.Equal(t, []string{"a", "b", "c"}, got)
	select {
	case <-s.C():
		t.Fatal("a second signal for marks already taken")
	default:
	}
	require.Empty(t, s.Take())
}

func TestSetMarkingNothingSignalsNothing(t *testing.T) {
	s := NewSet[int]()
	s.Mark()
	select {
	case <-s.C():
		t.Fatal("signalled without a key")
	default:
	}
}

// A reader that takes after each signal sees every key marked, however marks and takes
// interleave.
func TestSetLosesNoMarkUnderConcurrency(t *testing.T) {
	s := NewSet[int]()
	const n = 1000
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				s.Mark(i)
			}
		}()
	}
	seen := map[int]bool{}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for len(seen) < n {
		select {
		case <-s.C():
		case <-done:
		}
		for _, k := range s.Take() {
			seen[k] = true
		}
	}
	require.Len(t, seen, n)
}
