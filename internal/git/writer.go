package git

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// A branch has one writer at a time: the replica that owns it (internal/ownership). Views of who
// owns what still differ for moments (a paused process, a partition, a rolling update), so two
// workers may write one branch at once. Every worker therefore starts with a writer epoch, one
// more than the last of its writer slot (a Redis counter), and signs each commit it makes with
// the slot and the epoch (the trailer Kubescribe-Writer: "<provider namespace>/<name> <epoch>").
// A slot is a GitProvider's branch, what one worker writes: two GitProviders naming one
// repository write one branch through two slots (their own folders), and never supersede each
// other. A push is never forced, so two writers meet on the remote: the one
// whose push is refused fetches, and a worker that finds a commit of a newer epoch on the branch
// is superseded. It gives the branch up at once, pushes nothing more and drops what it holds:
// nothing of it was pushed, so no resume cursor covers it, and the newer writer's streams hand
// it over again from the cursors. A worker that finds an older epoch's commits builds on them,
// like on anyone's: they were observed before the newer writer started. So no change is
// committed twice, and a stale writer never puts an older state of an object over a newer one.
//
// Keys owned by this file, under the prefix P:
//
//	P:writer:<provider namespace>/<provider name>:<branch>
//	    an integer: the last writer epoch handed out for the branch (INCR), kept forever; raised
//	    to an epoch found on the branch that is higher (Reached: Redis lost the key).

// WriterTrailer is the commit trailer that names the epoch of the worker that made a commit.
const WriterTrailer = "Kubescribe-Writer"

// errSuperseded reports that a writer with a newer epoch pushed to the branch.
var errSuperseded = errors.New("a newer kubescribe writer writes this branch")

// ErrSuperseded is returned by Router.Route for a branch whose worker was superseded by a
// newer writer (another replica) since the ownership view last changed.
var ErrSuperseded = errors.New("another kubescribe replica writes this branch")

// WriterEpochs hands out writer epochs from Redis.
type WriterEpochs struct {
	rdb    redis.UniversalClient
	prefix keyspace.Prefix
}

// NewWriterEpochs returns WriterEpochs on rdb.
func NewWriterEpochs(rdb redis.UniversalClient, prefix keyspace.Prefix) *WriterEpochs {
	return &WriterEpochs{rdb: rdb, prefix: prefix}
}

// Next returns a new epoch for the branch of provider, higher than every one handed out before.
func (e *WriterEpochs) Next(ctx context.Context, provider types.NamespacedName, branch string) (int64, error) {
	n, err := e.rdb.Incr(ctx, e.prefix.Key("writer", provider.String(), branch)).Result()
	if err != nil {
		return 0, fmt.Errorf("writer epoch: %w", err)
	}
	return n, nil
}

// maxWriterEpoch bounds the epochs a commit's trailer may claim: far above what INCR reaches
// (one worker start a millisecond for 30 years), far below where INCR overflows. A trailer past
// it is someone's forgery and never honoured.
const maxWriterEpoch int64 = 1 << 40

// issuedScript answers whether ARGV[1] may be an epoch handed out for KEYS[1]: at most its
// counter, or, when the counter is missing (Redis lost it), at most maxWriterEpoch.
var issuedScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local n = tonumber(ARGV[1])
if v == false then
  return n <= tonumber(ARGV[2]) and 1 or 0
end
return n <= (tonumber(v) or 0) and 1 or 0
`)

// Issued reports whether epoch, found in a commit's trailer, may have been handed out for the
// branch of provider: it is at most the counter, or the counter is missing (Redis lost it) and
// epoch is at most maxWriterEpoch. A trailer above a counter Redis holds was written by
// someone with push access, not by a kubescribe writer: it supersedes nobody.
func (e *WriterEpochs) Issued(ctx context.Context, provider types.NamespacedName, branch string, epoch int64) (bool, error) {
	n, err := issuedScript.Run(ctx, e.rdb, []string{e.prefix.Key("writer", provider.String(), branch)}, epoch, maxWriterEpoch).Int()
	if err != nil {
		return false, fmt.Errorf("writer epoch: %w", err)
	}
	return n == 1, nil
}

// reachedScript sets KEYS[1] to ARGV[1] when that is higher than its value (none: 0).
var reachedScript = redis.NewScript(`
local v = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local n = tonumber(ARGV[1])
if n > v then
  redis.call('SET', KEYS[1], ARGV[1])
  return n
end
return v
`)

// Reached records that epoch was found on the branch of provider: every epoch Next hands out
// from now on is higher. The counter only ever lags an epoch on the branch when Redis lost it (a
// failover before replication, a flush); without this, a new worker would take an epoch lower
// than the branch's and be superseded by it again at once, once per epoch it lags.
func (e *WriterEpochs) Reached(ctx context.Context, provider types.NamespacedName, branch string, epoch int64) error {
	if epoch > maxWriterEpoch {
		return fmt.Errorf("writer epoch %d is above %d: never handed out", epoch, maxWriterEpoch)
	}
	if err := reachedScript.Run(ctx, e.rdb, []string{e.prefix.Key("writer", provider.String(), branch)}, epoch).Err(); err != nil {
		return fmt.Errorf("writer epoch: %w", err)
	}
	return nil
}

// writerTrailer is the trailer line of slot's epoch, "" for none (a worker without epochs).
func writerTrailer(slot string, epoch int64) string {
	if epoch <= 0 || slot == "" {
		return ""
	}
	return WriterTrailer + ": " + slot + " " + strconv.FormatInt(epoch, 10) + "\n"
}

// commitEpoch reads the writer epoch of slot from a commit's message: 0 without its trailer
// (someone else's commit, another slot's, or one made without epochs).
func commitEpoch(message, slot string) int64 {
	_, trailers := splitTrailers(message)
	return epochIn(trailers, slot)
}

// epochIn is commitEpoch of a message whose trailer lines are trailers (splitTrailers).
func epochIn(trailers []string, slot string) int64 {
	for i := len(trailers) - 1; i >= 0; i-- {
		v, ok := strings.CutPrefix(trailers[i], WriterTrailer+": ")
		if !ok {
			continue
		}
		s, e, _ := strings.Cut(strings.TrimSpace(v), " ")
		if s != slot {
			continue
		}
		if n, err := strconv.ParseInt(e, 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 0
}

// ensureEpoch takes the worker's epoch before its first clone (Options.WriterEpoch).
func (w *Worker) ensureEpoch(ctx context.Context) error {
	if w.epoch > 0 || w.opts.WriterEpoch == nil || w.opts.WriterSlot == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	n, err := w.opts.WriterEpoch(ctx)
	if err != nil {
		return err
	}
	w.epoch = n
	w.log = w.log.With("writer", n)
	w.log.Info("writer epoch taken")
	return nil
}

// newerWriter looks at the commits from tip down to stop (excluded, at most limit) for one of a
// writer epoch newer than the worker's, and returns that epoch (0 for none).
func (w *Worker) newerWriter(tip, stop plumbing.Hash, limit int) int64 {
	if w.epoch <= 0 {
		return 0
	}
	var newest int64
	walkCommits(w.store, tip, limit, func(h plumbing.Hash) bool {
		if h == stop {
			return false
		}
		c, err := object.GetCommit(w.store, h)
		if err != nil {
			return false
		}
		if e := commitEpoch(c.Message, w.opts.WriterSlot); e > w.epoch && signedBy(c, w.currentSigner()) {
			newest = max(newest, e)
		}
		return true
	})
	return newest
}

// honoured reports whether a commit's trailer epoch newer, above the worker's, was really handed
// out (Options.EpochIssued): otherwise it is someone's forgery, which is logged and counted and
// supersedes nothing. Correctness does not rest on epochs (carried.go): a worker that cannot
// tell goes on writing.
func (w *Worker) honoured(ctx context.Context, newer int64) bool {
	if newer > maxWriterEpoch {
		w.forgedEpoch(newer, nil)
		return false
	}
	if w.opts.EpochIssued == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
	defer cancel()
	ok, err := w.opts.EpochIssued(ctx, newer)
	if err != nil || !ok {
		w.forgedEpoch(newer, err)
		return false
	}
	return true
}

// forgedEpoch logs a trailer epoch that supersedes nothing.
func (w *Worker) forgedEpoch(epoch int64, err error) {
	w.opts.Metrics.epochIgnored()
	if err != nil {
		w.log.Warn("cannot check the writer epoch a commit on the branch claims; this writer goes on (a change the branch holds is not committed again either way)",
			"claimed", epoch, "err", err)
		return
	}
	w.log.Warn("a commit on the branch claims a writer epoch that was never handed out (pushed by someone with push access); it supersedes nothing",
		"claimed", epoch)
}

// supersede gives the branch up to the writer of epoch newer: everything held is dropped
// unpushed (the newer writer's streams hand it over again from the resume cursors), nothing is
// pushed any more, and Run returns. A change submitted later is dropped quietly.
func (w *Worker) supersede(newer int64) {
	w.mu.Lock()
	w.superseded, w.stopping, w.stopped = true, true, true
	w.queue = nil
	pending := w.status.Pending
	w.status.Pending = 0
	w.mu.Unlock()
	w.opts.Metrics.addPending(-pending)
	w.plans, w.win, w.settled = nil, nil, nil
	w.opts.Metrics.superseded()
	w.log.Warn("another kubescribe replica writes this branch now (a commit of a newer writer epoch is on it): this writer gives it up and drops what it holds unpushed; the newer writer writes it from the resume cursors",
		"newer_writer", newer, "dropped", pending)
	if w.opts.OnSuperseded != nil {
		w.opts.OnSuperseded(newer)
	}
}

// Superseded reports whether a newer writer took the branch over (supersede).
func (w *Worker) Superseded() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.superseded
}
