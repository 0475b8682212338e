// Package ownership decides which replica of kubescribe writes each branch, and which one runs
// the cluster-wide singletons.
//
// Every replica keeps a Lease of its own (a member Lease) in the install's namespace, renews it,
// and watches the other replicas' Leases. The owner of a branch is, among the live members, the
// one that ranks highest for the branch's key (rendezvous hashing): every replica computes the
// same owner from the same members, no record per branch is kept, and a member that joins or
// leaves moves only the branches it wins or held (about 1/N of them). A member is live while its
// Lease was renewed within its lease duration, measured by this replica's clock from when it saw
// the renewal (as client-go's leader election measures it), so replicas need no common clock.
//
// A replica that cannot renew its own Lease steps down from every branch before the others can
// see its Lease expire (RenewDeadline < LeaseDuration). Views still differ for moments (a
// paused process, a partition): two replicas may both believe they own a branch. The Git writer
// makes that safe (a branch's writer epoch, internal/git), not this package.
//
// The singletons (configuration kubescribe keeps in the cluster, clean-ups) run on the replica
// that holds the leader Lease, elected with client-go's leaderelection.
package ownership

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
)

// Defaults. client-go's leader election uses the same lease duration and renew deadline by
// default (kube-controller-manager's --leader-elect-lease-duration 15s, -renew-deadline 10s).
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewInterval = 5 * time.Second
	DefaultRenewDeadline = 10 * time.Second
)

// MemberLabel marks a member Lease; its value is the group (Options.Group), so that two
// installations sharing a namespace never count each other's replicas.
const MemberLabel = "kubescribe.dev/member-of"

// departedMemory is how long a member that left is remembered, to tell how long a branch it
// owned had no writer (TakeoverGap).
const departedMemory = 10 * time.Minute

// gcAfter is how many lease durations a member Lease may go unrenewed before a replica deletes
// it: a replica that was killed leaves its Lease behind, and a Deployment's next Pod has
// another name.
const gcAfter = 20

// Options configures a Membership.
type Options struct {
	// Client reaches the cluster kubescribe runs in; required.
	Client kubernetes.Interface
	// Namespace holds the Leases; required.
	Namespace string
	// Identity names this replica (its Pod's name); required, unique among the replicas.
	Identity string
	// Group names the installation; its Leases are "<Group>-member-<Identity>" and
	// "<Group>-leader". Default "kubescribe".
	Group string
	// LeaseDuration is how long this replica's Lease counts as held after a renewal;
	// RenewInterval how often it renews it; RenewDeadline how long after its last renewal it
	// steps down when renewals fail (< LeaseDuration). Zero values take the defaults.
	LeaseDuration, RenewInterval, RenewDeadline time.Duration
	// Logger and Registerer may be nil.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// now is the clock; test seam.
	now func() time.Time
}

// Membership is this replica's view of the replicas and what follows from it: which branches
// it owns and whether it leads.
type Membership struct {
	opts     Options
	log      *slog.Logger
	metrics  *metrics
	selector labels.Selector
	lease    string // this replica's member Lease
	changed  chan struct{}

	mu sync.Mutex
	// renewed is when this replica's Lease was last written (created or renewed); zero while
	// it holds none. It is a member, and owns branches, only while now-renewed < RenewDeadline.
	renewed time.Time
	// held is this replica's Lease as last written, nil while it holds none.
	held *coordinationv1.Lease
	// seen holds the other members' Leases as last observed: when their renewal changed, by
	// this replica's clock.
	seen map[string]*observed
	// live is the member set of the last published view (sorted), departed the members that
	// left it since, with when they were last known alive.
	live     []string
	departed map[string]time.Time
	leading  bool
	synced   bool
}

type observed struct {
	identity string
	renew    time.Time     // the Lease's renewTime as written
	at       time.Time     // when this replica saw that renewal
	duration time.Duration // the Lease's own duration
	deleted  bool
}

// New returns a Membership; Run joins.
func New(opts Options) (*Membership, error) {
	if opts.Client == nil || opts.Namespace == "" || opts.Identity == "" {
		return nil, errors.New("ownership: Client, Namespace and Identity are required")
	}
	if opts.Group == "" {
		opts.Group = "kubescribe"
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.RenewInterval == 0 {
		opts.RenewInterval = DefaultRenewInterval
	}
	if opts.RenewDeadline == 0 {
		opts.RenewDeadline = DefaultRenewDeadline
	}
	if opts.RenewInterval >= opts.RenewDeadline || opts.RenewDeadline >= opts.LeaseDuration {
		return nil, fmt.Errorf("ownership: need renew interval (%s) < renew deadline (%s) < lease duration (%s)",
			opts.RenewInterval, opts.RenewDeadline, opts.LeaseDuration)
	}
	if opts.LeaseDuration < time.Second {
		return nil, errors.New("ownership: the lease duration must be at least 1s (Leases count whole seconds)")
	}
	lease := leaseName(opts.Group, "member-"+opts.Identity)
	if errs := validation.IsDNS1123Subdomain(lease); len(errs) > 0 {
		return nil, fmt.Errorf("ownership: identity %q does not make a valid Lease name: %v", opts.Identity, errs)
	}
	if errs := validation.IsValidLabelValue(opts.Group); len(errs) > 0 {
		return nil, fmt.Errorf("ownership: group %q: %v", opts.Group, errs)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	return &Membership{
		opts:     opts,
		log:      opts.Logger.With("component", "ownership", "identity", opts.Identity),
		metrics:  newMetrics(opts.Registerer),
		selector: labels.SelectorFromSet(labels.Set{MemberLabel: opts.Group}),
		lease:    lease,
		changed:  make(chan struct{}, 1),
		seen:     map[string]*observed{},
		departed: map[string]time.Time{},
	}, nil
}

// leaseName is "<group>-<suffix>", the suffix cut and hashed when the name would pass the
// 253 characters of an object name.
func leaseName(group, suffix string) string {
	name := group + "-" + suffix
	if len(name) <= validation.DNS1123SubdomainMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return fmt.Sprintf("%s-%x", name[:validation.DNS1123SubdomainMaxLength-17], sum[:8])
}

// Identity is this replica's name.
func (m *Membership) Identity() string { return m.opts.Identity }

// Updates signals that the view changed: members came or went, this replica stepped down or
// back, or leadership moved. Owner and Leading then answer for the new view. Never closed.
func (m *Membership) Updates() <-chan struct{} { return m.changed }

func (m *Membership) signal() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Synced reports whether the view has been read: the other members' Leases were listed once
// and this replica's own Lease written. Before, it owns nothing.
func (m *Membership) Synced() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.synced && m.memberLocked(m.opts.now())
}

// memberLocked reports whether this replica counts itself a member at now.
func (m *Membership) memberLocked(now time.Time) bool {
	return !m.renewed.IsZero() && now.Sub(m.renewed) < m.opts.RenewDeadline
}

// Owner returns the member that owns key in this replica's view, or "" when there is none
// (this replica is not a member itself, or has not read the view yet).
func (m *Membership) Owner(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.synced || !m.memberLocked(m.opts.now()) {
		return ""
	}
	return rank(key, m.live)
}

// Owns reports whether this replica owns key.
func (m *Membership) Owns(key string) bool { return m.Owner(key) == m.opts.Identity }

// Members returns the live members of the current view, sorted.
func (m *Membership) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.live)
}

// Leading reports whether this replica holds the leader Lease.
func (m *Membership) Leading() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leading
}

// TakeoverGap tells, for a key this replica has just come to own, how long the key had no
// writer: when the member that owned it before has left (its Lease deleted or expired), the
// time since it was last known alive. ok is false when the key moved for another reason (this
// replica joined and won it: its previous owner hands it over while running).
func (m *Membership) TakeoverGap(key string) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.departed) == 0 {
		return 0, false
	}
	all := slices.Clone(m.live)
	for id := range m.departed {
		all = append(all, id)
	}
	prev := rank(key, all)
	last, gone := m.departed[prev]
	if !gone {
		return 0, false
	}
	return max(0, m.opts.now().Sub(last)), true
}

// PreviousOwnerLost tells, for a key this replica owns, whether the writer before it may have
// died holding changes it had not pushed, so that its streams should replay what it may have
// held: the member that owned the key before has left (its Lease expired, or was deleted after
// it pushed), or no other member would own it (the writer before was this replica's own previous
// process, or nobody). It is false when a live member owned it before this replica came: that
// member hands the key over while running, and pushes what it holds itself.
func (m *Membership) PreviousOwnerLost(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	others := make([]string, 0, len(m.live)+len(m.departed))
	for _, id := range m.live {
		if id != m.opts.Identity {
			others = append(others, id)
		}
	}
	for id := range m.departed {
		others = append(others, id)
	}
	prev := rank(key, others)
	if prev == "" {
		return true
	}
	_, gone := m.departed[prev]
	return gone
}

// OwnerOf returns the member of members that owns key: what every replica computes from the
// same view ("" for no member).
func OwnerOf(key string, members []string) string { return rank(key, members) }

// rank returns the member of members that ranks highest for key ("" for none).
func rank(key string, members []string) string {
	best, bestScore := "", uint64(0)
	for _, id := range members {
		if s := score(id, key); best == "" || s > bestScore || (s == bestScore && id < best) {
			best, bestScore = id, s
		}
	}
	return best
}

// score is the rendezvous weight of member for key: the first 8 bytes of SHA-256 of both.
func score(member, key string) uint64 {
	h := sha256.New()
	h.Write([]byte(member))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// Run joins the members and keeps this replica's Lease renewed until ctx ends, then leaves
// (deletes its Lease, so that its branches move at once). It also takes part in the leader
// election. It returns when ctx ends.
func (m *Membership) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(m.opts.Client, 0,
		informers.WithNamespace(m.opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = m.selector.String() }))
	inf := factory.Coordination().V1().Leases().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.observe(obj, false) },
		UpdateFunc: func(_, obj any) { m.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			m.observe(obj, true)
		},
	}); err != nil {
		return err
	}
	informerCtx, stopInformer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopInformer()
	factory.Start(informerCtx.Done())

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.lead(ctx) }()

	// Join: the first renewal creates the Lease. Then the view is published once the other
	// members are listed.
	m.renew(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		wg.Wait()
		m.leave()
		return nil
	}
	m.mu.Lock()
	m.synced = true
	m.mu.Unlock()
	m.publish()

	renew := time.NewTicker(m.opts.RenewInterval)
	defer renew.Stop()
	// The view is recomputed every second (or renewal) besides: a member expires without an
	// event.
	tick := time.NewTicker(min(time.Second, m.opts.RenewInterval))
	defer tick.Stop()
	gc := time.NewTicker(m.opts.LeaseDuration * 4)
	defer gc.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			m.leave()
			return nil
		case <-renew.C:
			m.renew(ctx)
			m.publish()
		case <-tick.C:
			m.publish()
		case <-gc.C:
			m.collect(ctx)
		}
	}
}

// renew writes this replica's Lease: renews the one it holds, or creates it (reading it first
// when it exists already: a restart under the same name).
func (m *Membership) renew(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.RenewInterval)
	defer cancel()
	leases := m.opts.Client.CoordinationV1().Leases(m.opts.Namespace)
	now := m.opts.now()
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(m.opts.Identity),
		LeaseDurationSeconds: ptr.To(int32(m.opts.LeaseDuration / time.Second)),
		RenewTime:            ptr.To(metav1.NewMicroTime(now)),
		AcquireTime:          ptr.To(metav1.NewMicroTime(now)),
	}
	m.mu.Lock()
	lease := m.held
	m.mu.Unlock()
	var err error
	if lease == nil {
		if lease, err = leases.Get(ctx, m.lease, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			lease, err = nil, nil
		}
	}
	switch {
	case err != nil:
	case lease == nil:
		lease, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: m.lease, Namespace: m.opts.Namespace,
				Labels: map[string]string{MemberLabel: m.opts.Group}},
			Spec: spec,
		}, metav1.CreateOptions{FieldManager: "kubescribe"})
	default:
		lease = lease.DeepCopy()
		if lease.Spec.AcquireTime != nil && m.isHeld() {
			spec.AcquireTime = lease.Spec.AcquireTime
		}
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[MemberLabel] = m.opts.Group
		lease.Spec = spec
		lease, err = leases.Update(ctx, lease, metav1.UpdateOptions{FieldManager: "kubescribe"})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		// Read it afresh next time: it may have been changed or deleted.
		m.held = nil
		m.metrics.renewFailures.Inc()
		if m.memberLocked(m.opts.now()) {
			m.log.Warn("cannot renew this replica's member Lease; it steps down from every branch if this lasts",
				"lease", m.lease, "deadline", m.renewed.Add(m.opts.RenewDeadline).Format(time.RFC3339), "err", err)
		}
		return
	}
	if !m.memberLocked(now) {
		m.log.Info("joined the replicas writing branches", "lease", m.lease, "namespace", m.opts.Namespace)
		if !m.renewed.IsZero() {
			// Back after being cut off (the apiserver away, a pause): whatever renewals the
			// others made meanwhile were not seen, so nothing tells them dead yet. Each gets
			// a lease duration from now, as a leader candidate waits a full lease duration
			// of its own observation: otherwise every replica cut off by one apiserver
			// outage comes back believing it alone is live, and all write every branch.
			for _, o := range m.seen {
				if !o.deleted {
					o.at = now
				}
			}
		}
	}
	m.renewed, m.held = now, lease
}

// isHeld reports whether this replica counts itself a member now.
func (m *Membership) isHeld() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.memberLocked(m.opts.now())
}

// observe records a member Lease as the informer delivered it.
func (m *Membership) observe(obj any, deleted bool) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok || lease.Labels[MemberLabel] != m.opts.Group || lease.Name == m.lease ||
		lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" || *lease.Spec.HolderIdentity == m.opts.Identity {
		return
	}
	id := *lease.Spec.HolderIdentity
	now := m.opts.now()
	var renew time.Time
	if lease.Spec.RenewTime != nil {
		renew = lease.Spec.RenewTime.Time
	}
	duration := m.opts.LeaseDuration
	if d := lease.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		duration = time.Duration(*d) * time.Second
	}
	m.mu.Lock()
	o, known := m.seen[id]
	switch {
	case deleted:
		if known {
			o.deleted, o.at = true, now
		}
	case !known:
		// First sight (the initial list, or a new member): its renewal is trusted to have
		// happened when it says, but never later than now.
		at := renew
		if at.After(now) || at.IsZero() {
			at = now
		}
		m.seen[id] = &observed{identity: id, renew: renew, at: at, duration: duration}
	case !renew.Equal(o.renew) || o.deleted:
		o.renew, o.at, o.duration, o.deleted = renew, now, duration, false
	}
	m.mu.Unlock()
	if m.Synced() {
		m.publish()
	}
}

// publish recomputes the live members and signals when the view changed.
func (m *Membership) publish() {
	m.mu.Lock()
	now := m.opts.now()
	var live []string
	for id, o := range m.seen {
		if !o.deleted && now.Sub(o.at) < o.duration {
			live = append(live, id)
		}
	}
	self := m.synced && m.memberLocked(now)
	if self {
		live = append(live, m.opts.Identity)
	}
	slices.Sort(live)
	changed := !slices.Equal(live, m.live)
	if changed {
		for _, id := range m.live {
			o := m.seen[id]
			if slices.Contains(live, id) || id == m.opts.Identity || o == nil {
				continue
			}
			m.departed[id] = o.at
			m.log.Info("a replica left; the branches it owned move", "member", id,
				"last_seen", o.at.Format(time.RFC3339Nano), "deleted", o.deleted)
		}
		for _, id := range live {
			delete(m.departed, id)
		}
		if !self && slices.Contains(m.live, m.opts.Identity) {
			m.log.Warn("this replica stepped down from every branch: its member Lease could not be renewed in time",
				"deadline", m.opts.RenewDeadline)
		}
		m.live = live
	}
	for id, at := range m.departed {
		if now.Sub(at) > departedMemory {
			delete(m.departed, id)
		}
	}
	for id, o := range m.seen {
		if o.deleted && now.Sub(o.at) > departedMemory {
			delete(m.seen, id)
		}
	}
	m.metrics.members.Set(float64(len(live)))
	m.mu.Unlock()
	if changed {
		m.metrics.viewChanges.Inc()
		m.signal()
	}
}

// leave deletes this replica's Lease, so that the others take its branches over at once.
func (m *Membership) leave() {
	m.mu.Lock()
	held := m.held
	m.renewed, m.held = time.Time{}, nil
	m.mu.Unlock()
	m.publish()
	if held == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := m.opts.Client.CoordinationV1().Leases(m.opts.Namespace).Delete(ctx, m.lease,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(held.UID)}})
	if err != nil && !apierrors.IsNotFound(err) {
		m.log.Warn("cannot delete this replica's member Lease; its branches move once it expires",
			"lease", m.lease, "expires_in", m.opts.LeaseDuration, "err", err)
		return
	}
	m.log.Info("left the replicas writing branches; the others take its branches over", "lease", m.lease)
}

// collect deletes member Leases of the group that nobody renewed for gcAfter lease durations.
func (m *Membership) collect(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	leases := m.opts.Client.CoordinationV1().Leases(m.opts.Namespace)
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: m.selector.String()})
	if err != nil {
		return
	}
	now := m.opts.now()
	for i := range list.Items {
		l := &list.Items[i]
		if l.Name == m.lease || l.Spec.RenewTime == nil {
			continue
		}
		duration := m.opts.LeaseDuration
		if d := l.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
			duration = time.Duration(*d) * time.Second
		}
		if now.Sub(l.Spec.RenewTime.Time) < gcAfter*duration {
			continue
		}
		err := leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{
			UID: ptr.To(l.UID), ResourceVersion: ptr.To(l.ResourceVersion)}})
		if err == nil {
			m.log.Info("deleted the member Lease of a replica gone long ago", "lease", l.Name,
				"renewed", l.Spec.RenewTime.Format(time.RFC3339))
		}
	}
}

// lead takes part in the election of the leader, which runs the singletons, until ctx ends;
// leadership is released then.
func (m *Membership) lead(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: m.opts.Namespace, Name: leaseName(m.opts.Group, "leader")},
		Client:     m.opts.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: m.opts.Identity},
	}
	setLeading := func(v bool) {
		m.mu.Lock()
		was := m.leading
		m.leading = v
		m.mu.Unlock()
		if was != v {
			m.metrics.leader.Set(map[bool]float64{true: 1}[v])
			m.log.Info("leadership changed", "leading", v)
			m.signal()
		}
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            lock.LeaseMeta.Name,
		LeaseDuration:   m.opts.LeaseDuration,
		RenewDeadline:   m.opts.RenewDeadline,
		RetryPeriod:     m.opts.RenewInterval / 2,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { setLeading(true) },
			OnStoppedLeading: func() { setLeading(false) },
		},
	})
	if err != nil {
		m.log.Error("cannot take part in the leader election; this replica never runs the singletons", "err", err)
		return
	}
	for ctx.Err() == nil {
		elector.Run(ctx) // returns when leadership is lost, or ctx ends
	}
}
