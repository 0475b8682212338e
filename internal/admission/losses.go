package admission

import (
	"context"
	"sync"
	"time"
)

// LossWindow is how long before a change's watch event a lost review of its route makes the
// change doubtful. The apiserver gives a webhook call up to its timeoutSeconds (at most 30s,
// kubescribe's configurations say 2s) and then admits the write unreviewed (failurePolicy
// Ignore); the watch sees it a moment later (audit.DeliverySlack covers that lag).
const LossWindow = 30*time.Second + 2*time.Second

// lossHistoryTTL keeps a recorded loss longer than any change waits for its author.
const lossHistoryTTL = 10 * time.Minute

// lossTimeout bounds one call to the history.
const lossTimeout = 2 * time.Second

// LossHistory keeps, across replicas, when a review of each route was last lost;
// internal/attribution's Store implements it in Redis. A time never recorded is zero.
type LossHistory interface {
	RecordReviewLoss(ctx context.Context, route string, t time.Time, ttl time.Duration) error
	LastReviewLoss(ctx context.Context, route string) (time.Time, error)
}

// Losses tells when a review the apiserver sent for a route may have been lost: refused busy
// (429), over a bound, with a body too slow or cut off, undecodable, past the user caps, or
// dropped before Redis took its candidate. The apiserver then admitted the write without a
// candidate of its real author (failurePolicy Ignore), so a candidate of another user that
// matches it may be the only one left, and may be forged by whoever holds the route's
// credential: it can even cause the loss (issue 36, finding 1). A change of the route observed
// up to LossWindow after such a loss is doubtful, and the join leaves a change only one user's
// candidates confirm unresolved then.
//
// Every replica records its losses here and, through the history, for the others. Only routes
// an authenticated caller may post for are recorded, so the map stays small.
type Losses struct {
	history LossHistory

	mu      sync.Mutex
	last    map[string]time.Time // the newest loss of each route, in this process
	pending map[string]time.Time // the newest loss not written to the history yet
	writing map[string]bool      // a write to the history is under way
}

// NewLosses returns a Losses that knows of no loss yet. history may be nil: then only this
// process's losses make a change doubtful.
func NewLosses(history LossHistory) *Losses {
	return &Losses{history: history, last: map[string]time.Time{}, pending: map[string]time.Time{}, writing: map[string]bool{}}
}

// Lost records that a review of route was lost at t. The history is written off the caller's
// path, one write per route at a time, always the newest.
func (l *Losses) Lost(route string, t time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.After(l.last[route]) {
		l.last[route] = t
	}
	if l.history == nil {
		return
	}
	if t.After(l.pending[route]) {
		l.pending[route] = t
	}
	if !l.writing[route] {
		l.writing[route] = true
		go l.record(route)
	}
}

// record writes route's pending losses to the history until none is left.
func (l *Losses) record(route string) {
	for {
		l.mu.Lock()
		t, ok := l.pending[route]
		delete(l.pending, route)
		if !ok {
			l.writing[route] = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), lossTimeout)
		// Best effort: a failed write leaves the other replicas unaware; this one knows.
		_ = l.history.RecordReviewLoss(ctx, route, t, lossHistoryTTL)
		cancel()
	}
}

// Doubtful reports whether a review of route may have been lost at or after LossWindow before
// observed, in this process or, as recorded, another. A history that cannot be read counts as
// doubtful.
func (l *Losses) Doubtful(route string, observed time.Time) bool {
	if l == nil {
		return false
	}
	since := observed.Add(-LossWindow)
	l.mu.Lock()
	last, ok := l.last[route]
	l.mu.Unlock()
	if ok && !last.Before(since) {
		return true
	}
	if l.history == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), lossTimeout)
	defer cancel()
	t, err := l.history.LastReviewLoss(ctx, route)
	return err != nil || !t.IsZero() && !t.Before(since)
}
