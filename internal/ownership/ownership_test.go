package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

func TestRankIsStableAndMovesOnlyWhatAMemberWins(t *testing.T) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("team-%d/git:main-%d", i%37, i)
	}
	three := []string{"kubescribe-a", "kubescribe-b", "kubescribe-c"}
	before := map[string]string{}
	count := map[string]int{}
	for _, k := range keys {
		before[k] = rank(k, three)
		count[before[k]]++
		require.Equal(t, before[k], rank(k, []string{"kubescribe-c", "kubescribe-a", "kubescribe-b"}), "order of members matters")
	}
	for _, id := range three {
		require.InDelta(t, 333, count[id], 60, "branches of %s: %v", id, count)
	}
	// A fourth member takes about a quarter, each from whoever held it; nothing else moves.
	four := append(three[:3:3], "kubescribe-d")
	moved := 0
	for _, k := range keys {
		now := rank(k, four)
		if now != before[k] {
			require.Equal(t, "kubescribe-d", now)
			moved++
		}
	}
	require.InDelta(t, 250, moved, 50)
	// A member that leaves hands over exactly its own.
	for _, k := range keys {
		now := rank(k, []string{"kubescribe-a", "kubescribe-c"})
		if before[k] != "kubescribe-b" {
			require.Equal(t, before[k], now)
		}
	}
	require.Equal(t, "", rank("x", nil))
}

// fast are short durations for tests on the real clock: renew every 200ms, step down 700ms
// after the last renewal, expire 1s after it.
func fast(o Options) Options {
	o.LeaseDuration, o.RenewDeadline, o.RenewInterval = time.Second, 700*time.Millisecond, 200*time.Millisecond
	return o
}

type member struct {
	*Membership
	cancel context.CancelFunc
	done   chan struct{}
}

func start(t *testing.T, client *fake.Clientset, id string, reg prometheus.Registerer) *member {
	t.Helper()
	m, err := New(fast(Options{Client: client, Namespace: "kubescribe", Identity: id, Logger: testLogger(t), Registerer: reg}))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	mb := &member{Membership: m, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(mb.done); _ = m.Run(ctx) }()
	t.Cleanup(mb.stop)
	return mb
}

func (m *member) stop() {
	m.cancel()
	<-m.done
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("ns/provider:branch-%d", i)
	}
	return out
}

// agree waits until every member sees the same members (want) and each key has one owner that
// owns it in every view.
func agree(t *testing.T, want []string, ms ...*member) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, m := range ms {
			if fmt.Sprint(m.Members()) != fmt.Sprint(want) || !m.Synced() {
				return false
			}
		}
		for _, k := range keys(50) {
			owners := 0
			for _, m := range ms {
				if m.Owns(k) {
					owners++
				}
			}
			if owners != 1 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "members never agreed on %v", want)
}

func TestMembersAgreeAndAGracefulLeaveMovesItsBranchesAtOnce(t *testing.T) {
	client := fake.NewClientset()
	reg := prometheus.NewRegistry()
	a := start(t, client, "kubescribe-a", reg)
	b := start(t, client, "kubescribe-b", nil)
	agree(t, []string{"kubescribe-a", "kubescribe-b"}, a, b)
	require.Equal(t, 2.0, testutil.ToFloat64(a.metrics.members))

	var mine []string
	for _, k := range keys(50) {
		if b.Owns(k) {
			mine = append(mine, k)
		}
	}
	require.NotEmpty(t, mine)
	b.stop() // deletes its Lease
	_, err := client.CoordinationV1().Leases("kubescribe").Get(context.Background(), "kubescribe-member-kubescribe-b", metav1.GetOptions{})
	require.True(t, isNotFound(err), "the Lease of a replica that left: %v", err)
	agree(t, []string{"kubescribe-a"}, a)
	for _, k := range mine {
		gap, known := a.TakeoverGap(k)
		require.True(t, known, k)
		require.Less(t, gap, 500*time.Millisecond, "a graceful leave is seen at once")
	}
	for _, k := range keys(50) {
		if _, known := a.TakeoverGap(k); known {
			require.Contains(t, mine, k, "only b's branches were taken over")
		}
	}
}

func TestAKilledMemberExpiresAndOneThatCannotRenewStepsDownFirst(t *testing.T) {
	client := fake.NewClientset()
	var refuseB atomic.Bool
	client.PrependReactor("update", "leases", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.UpdateAction).GetObject()
		if m, ok := obj.(metav1.Object); ok && m.GetName() == "kubescribe-member-kubescribe-b" && refuseB.Load() {
			return true, nil, errors.New("apiserver unreachable")
		}
		return false, nil, nil
	})
	a := start(t, client, "kubescribe-a", nil)
	b := start(t, client, "kubescribe-b", nil)
	agree(t, []string{"kubescribe-a", "kubescribe-b"}, a, b)

	refuseB.Store(true)
	cut := time.Now()
	// b stops counting itself a member before a stops counting it: never both owners for long.
	var bDown, aSawIt time.Time
	require.Eventually(t, func() bool {
		if bDown.IsZero() && b.Owner("ns/provider:branch-1") == "" {
			bDown = time.Now()
		}
		if aSawIt.IsZero() && len(a.Members()) == 1 {
			aSawIt = time.Now()
		}
		return !bDown.IsZero() && !aSawIt.IsZero()
	}, 10*time.Second, 10*time.Millisecond)
	require.True(t, bDown.Before(aSawIt), "b stepped down %s after the cut, a took over %s after", bDown.Sub(cut), aSawIt.Sub(cut))
	for _, k := range keys(50) {
		require.True(t, a.Owns(k))
		require.False(t, b.Owns(k))
	}

	// b comes back once it renews again.
	refuseB.Store(false)
	agree(t, []string{"kubescribe-a", "kubescribe-b"}, a, b)
}

// A replica cut off from the apiserver longer than the lease (an outage that cut off every
// replica, whose watches then relist late) saw none of the others' renewals meanwhile: back, it
// must not count them dead at once, or every replica comes back believing it alone is live and
// writes every branch. It gives each a lease duration from its return, as a leader candidate
// waits a full lease duration of its own observation.
func TestAReplicaBackFromAnOutageCountsTheOthersLive(t *testing.T) {
	client := fake.NewClientset()
	now := time.Now()
	m, err := New(fast(Options{Client: client, Namespace: "kubescribe", Identity: "kubescribe-a", Logger: testLogger(t)}))
	require.NoError(t, err)
	m.opts.now = func() time.Time { return now }
	ctx := context.Background()

	m.renew(ctx) // joins
	m.mu.Lock()
	m.synced = true
	m.mu.Unlock()
	m.observe(leaseFor("kubescribe-member-kubescribe-b", metav1.NewMicroTime(now)), false)
	m.publish()
	require.Equal(t, []string{"kubescribe-a", "kubescribe-b"}, m.Members())

	now = now.Add(3 * time.Second) // cut off: no renewal of its own, none of b's seen
	m.publish()
	require.Empty(t, m.Members(), "stepped down, and b's lease looks expired")
	m.renew(ctx) // back
	m.publish()
	require.Equal(t, []string{"kubescribe-a", "kubescribe-b"}, m.Members(), "b gets a lease duration from a's return")
	for range 3 { // a renews on; b never does: it is dead after all, a lease duration later
		now = now.Add(400 * time.Millisecond)
		m.renew(ctx)
		m.publish()
	}
	require.Equal(t, []string{"kubescribe-a"}, m.Members())
}

func TestOneLeaderAndTheNextTakesOverWhenItLeaves(t *testing.T) {
	client := fake.NewClientset()
	a := start(t, client, "kubescribe-a", nil)
	b := start(t, client, "kubescribe-b", nil)
	var first *member
	require.Eventually(t, func() bool {
		switch {
		case a.Leading() && !b.Leading():
			first = a
		case b.Leading() && !a.Leading():
			first = b
		}
		return first != nil
	}, 10*time.Second, 10*time.Millisecond)
	other := map[*member]*member{a: b, b: a}[first]
	first.stop()
	require.Eventually(t, other.Leading, 10*time.Second, 10*time.Millisecond, "released on leave, so taken at once")
}

func TestLongGoneMembersLeasesAreCollected(t *testing.T) {
	client := fake.NewClientset()
	m, err := New(fast(Options{Client: client, Namespace: "kubescribe", Identity: "kubescribe-a", Logger: testLogger(t)}))
	require.NoError(t, err)
	old := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	recent := metav1.NewMicroTime(time.Now())
	for name, at := range map[string]metav1.MicroTime{"kubescribe-member-gone": old, "kubescribe-member-alive": recent} {
		l := leaseFor(name, at)
		_, err := client.CoordinationV1().Leases("kubescribe").Create(context.Background(), l, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	m.collect(context.Background())
	list, err := client.CoordinationV1().Leases("kubescribe").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, list.Items, 1)
	require.Equal(t, "kubescribe-member-alive", list.Items[0].Name)
}

func TestOptionsAreChecked(t *testing.T) {
	client := fake.NewClientset()
	for name, o := range map[string]Options{
		"no identity":       {Client: client, Namespace: "n"},
		"deadline too long": {Client: client, Namespace: "n", Identity: "a", LeaseDuration: 10 * time.Second, RenewDeadline: 10 * time.Second},
		"bad identity":      {Client: client, Namespace: "n", Identity: "A_b"},
	} {
		_, err := New(o)
		require.Error(t, err, name)
	}
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'a'
	}
	m, err := New(Options{Client: client, Namespace: "n", Identity: string(long)})
	require.NoError(t, err)
	require.LessOrEqual(t, len(m.lease), 253)
}

// testLogger logs through t, so that a failing test shows what each member did.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

func leaseFor(name string, renewed metav1.MicroTime) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kubescribe", Labels: map[string]string{MemberLabel: "kubescribe"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(strings.TrimPrefix(name, "kubescribe-member-")), LeaseDurationSeconds: ptr.To(int32(1)), RenewTime: &renewed},
	}
}

// PreviousOwnerLost: alone, a replica's predecessor was its own previous process (lost); a key a
// joining replica wins from a live member is handed over (not lost); a key whose owner left is.
func TestPreviousOwnerLost(t *testing.T) {
	client := fake.NewClientset()
	a := start(t, client, "kubescribe-a", nil)
	agree(t, []string{"kubescribe-a"}, a)
	for _, k := range keys(50) {
		require.True(t, a.PreviousOwnerLost(k), "alone: the writer before was this replica's previous process")
	}
	b := start(t, client, "kubescribe-b", nil)
	agree(t, []string{"kubescribe-a", "kubescribe-b"}, a, b)
	var won []string
	for _, k := range keys(50) {
		if b.Owns(k) {
			won = append(won, k)
			require.False(t, b.PreviousOwnerLost(k), "%s: a, alive, hands it over and pushes what it holds", k)
		}
	}
	require.NotEmpty(t, won)
	b.stop()
	agree(t, []string{"kubescribe-a"}, a)
	for _, k := range won {
		require.True(t, a.PreviousOwnerLost(k), "%s: b left", k)
	}
}
