package git

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/redis/go-redis/v9"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// A push and the advance of the resume cursors it covers are two writes to two systems: the
// Git server, then Redis (Router.onPushed). A writer killed between them (SIGKILL, OOM, a lost
// node, a few milliseconds after the server took the push) leaves the branch ahead of the
// cursors. Its heir replays the events since the cursors (watch/replay.go); the versions that
// push delivered must not be committed again, nor an older version of their objects over a
// newer one.
//
// What the branch holds is read from the branch itself: each commit carries its changes
// (carried.go). What the heir must read is every commit whose changes no cursor may show yet:
// the commits of each writer's last push. So before each push the worker records in Redis the
// commit the push makes the tip and the commit it is built on (its base). The record is the
// writer's own (keyed by its writer epoch, which its commits carry), so that two writers of a
// branch at once never overwrite each other's. A worker that opens the branch reads the commits
// from the tip down: through someone else's commits, through the commits of a recorded last
// push down to its base, and on through the last push of the writer before when the base is
// one; there it stops (takeInAtOpen). Every earlier push's cursors were advanced before the next
// push began (Router.onPushed runs before the worker goes on), unless Redis refused the advance,
// and then it refuses this record too.
//
// Keys owned by this file, under the prefix P:
//
//	P:pushed:<writer slot>:<branch>:<writer epoch>
//	    a pushDelivery (JSON) of the last push to the branch by the writer of that epoch of the
//	    slot (its GitProvider, "<namespace>/<name>"), expiring after deliveryTTL.

// deliveryVersion is the version of pushDelivery; a record of another version is ignored (the
// walk at open then stops at the commit it would have bounded).
const deliveryVersion = 2

// deliveryTTL bounds how long a record is kept: far longer than a takeover or an outage of
// every replica takes. A record is two commit hashes.
const deliveryTTL = 7 * 24 * time.Hour

// deliveryTimeout bounds one call to Redis.
const deliveryTimeout = 2 * time.Second

// openScanLimit bounds the commits a worker reads when it opens the branch (takeInAtOpen).
const openScanLimit = 4096

// openForeignLimit bounds the commits of someone else a worker reads through, at open, looking
// for the slot's last push below them: a branch with no kubescribe commit among its newest 64
// has no push whose cursors might lag.
const openForeignLimit = 64

// pushDelivery is what a worker records before a push.
type pushDelivery struct {
	V int `json:"v"`
	// SHA is the commit the push makes the branch's tip.
	SHA string `json:"sha"`
	// Base is the commit the push is built on: the branch's tip before it (empty: the push
	// creates the branch).
	Base string `json:"base,omitempty"`
	// BaseEpoch is the writer epoch of the slot that made Base (0: someone else's commit).
	BaseEpoch int64 `json:"baseEpoch,omitempty"`
}

// pushedObject names an object of a cluster the way a commit's change lines do (carried.go).
func pushedObject(c attribution.AttributedChange) string {
	return c.Cluster + "\x00" + c.GVR.Group + "/" + c.GVR.Resource + "\x00" + c.Namespace + "/" + c.Name
}

// onBranch is what the branch holds that the worker did not commit itself, read from the
// commits it took in (carried.go): the newest version of each object, by folder.
type onBranch map[[2]string]heldVersion

// heldVersion is the newest version of an object commits carry, and whether it is its delete.
type heldVersion struct {
	rv      uint64
	deleted bool
}

// newer is the newer of v and o (o on a tie).
func (v heldVersion) newer(o heldVersion) heldVersion {
	if v.rv > o.rv {
		return v
	}
	return o
}

// holds reports whether the branch holds a version of c's object, in the folder of
// targetPath, that c must not be committed over: a newer one, or c's own version (an
// Unchanged change of its own version restores a file the branch lost, and is not held back).
func (b onBranch) holds(targetPath string, c attribution.AttributedChange) bool {
	if len(b) == 0 {
		return false
	}
	rv, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
	if err != nil {
		return false
	}
	on, ok := b[[2]string{folderKey(targetPath), pushedObject(c)}]
	switch {
	case !ok:
		return false
	case c.Op == watch.OpDelete:
		// A delete found from a resume cursor names the last version the cursor held, which
		// the branch holds alive: that delete is news. One older than a version the branch
		// holds is not (the name was taken again), nor one the branch holds already.
		return rv < on.rv || rv == on.rv && on.deleted
	default:
		return rv < on.rv || rv == on.rv && !on.deleted && !c.Unchanged
	}
}

// alive reports whether another writer's commits hold a version of c's object in the folder of
// targetPath that is not its delete and is newer than what the sweep saw (sweepRV, the sweep's
// ResourceVersion): a sweep whose stream's view lags behind that writer's does not take such an
// object's file away (its own stream reports the delete, if there is one). A sweep that does
// not say what it saw keeps nothing.
func (b onBranch) alive(targetPath string, c attribution.AttributedChange, sweepRV string) bool {
	seen, err := strconv.ParseUint(sweepRV, 10, 64)
	if err != nil {
		return false
	}
	on, ok := b[[2]string{folderKey(targetPath), pushedObject(c)}]
	return ok && !on.deleted && on.rv > seen
}

// Deliveries keeps each writer slot's last push record in Redis.
type Deliveries struct {
	rdb    redis.UniversalClient
	prefix keyspace.Prefix
}

// NewDeliveries returns Deliveries on rdb.
func NewDeliveries(rdb redis.UniversalClient, prefix keyspace.Prefix) *Deliveries {
	return &Deliveries{rdb: rdb, prefix: prefix}
}

// key is the record's key for a writer slot (Options.WriterSlot), branch and writer epoch.
func (s *Deliveries) key(slot, branch string, epoch int64) string {
	return s.prefix.Key("pushed", slot, branch, strconv.FormatInt(epoch, 10))
}

// record stores rec as the last push to slot's branch by the writer of epoch.
func (s *Deliveries) record(ctx context.Context, slot, branch string, epoch int64, rec pushDelivery) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.rdb.Set(ctx, s.key(slot, branch, epoch), b, deliveryTTL).Err(); err != nil {
		return fmt.Errorf("record the push: %w", err)
	}
	return nil
}

// last reads the last push to slot's branch by the writer of epoch; ok is false without one.
func (s *Deliveries) last(ctx context.Context, slot, branch string, epoch int64) (rec pushDelivery, ok bool, err error) {
	b, err := s.rdb.Get(ctx, s.key(slot, branch, epoch)).Bytes()
	if errors.Is(err, redis.Nil) {
		return pushDelivery{}, false, nil
	}
	if err != nil {
		return pushDelivery{}, false, fmt.Errorf("read the last push: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return pushDelivery{}, false, fmt.Errorf("%w: %w", errUnreadableDelivery, err)
	}
	return rec, true, nil
}

// errUnreadableDelivery: a push record Redis gave is no record of this format. It is ignored,
// as one of another version is: retrying would not mend it.
var errUnreadableDelivery = errors.New("the last push record is no JSON record")

// recordPush records, before a push, what pushing the local tip delivers. A failure is logged
// and the push goes on: Redis refuses the cursors' advance too, and the changes are then
// replayed, and left out by the commits that carry them, as they always are.
func (w *Worker) recordPush(ctx context.Context) {
	if w.opts.Pushes == nil || w.opts.WriterSlot == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
	defer cancel()
	rec := pushDelivery{V: deliveryVersion, SHA: w.localTip.String()}
	if !w.remoteTip.IsZero() && !w.remoteGone {
		rec.Base = w.remoteTip.String()
		if c, err := object.GetCommit(w.store, w.remoteTip); err == nil {
			rec.BaseEpoch = commitEpoch(c.Message, w.opts.WriterSlot)
		}
	}
	if err := w.opts.Pushes.record(ctx, w.opts.WriterSlot, w.opts.Branch, w.epoch, rec); err != nil {
		w.log.Warn("cannot record the push in Redis; if this replica dies before the resume cursors advance, its successor reads the branch's history only as far as the records before it allow",
			"err", err)
	}
}

// takeInAtOpen reads what the branch holds into Worker.held when the worker opens it at tip:
// the commits of each writer's last push, and someone else's commits on top of them
// (pushDelivery). It fetches the branch's commits, without their trees, only when the tip's
// commit alone does not settle it. A record Redis cannot give fails the clone, which is
// retried: without it, a replay could commit a version twice.
func (w *Worker) takeInAtOpen(ctx context.Context, store *memory.Storage, tip plumbing.Hash) error {
	if w.opts.WriterSlot == "" || tip.IsZero() {
		return nil
	}
	records := map[int64]*pushDelivery{}
	record := func(epoch int64) (*pushDelivery, error) {
		if r, ok := records[epoch]; ok {
			return r, nil
		}
		var r *pushDelivery
		if w.opts.Pushes != nil {
			rctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
			rec, ok, err := w.opts.Pushes.last(rctx, w.opts.WriterSlot, w.opts.Branch, epoch)
			cancel()
			switch {
			case errors.Is(err, errUnreadableDelivery):
				w.log.Warn("ignoring a push record that is no JSON record", "writer", epoch, "err", err)
			case err != nil:
				return nil, err
			case ok && rec.V == deliveryVersion:
				r = &rec
			}
		}
		records[epoch] = r
		return r, nil
	}
	src := storer.EncodedObjectStorer(store)
	for depth := 64; ; depth *= 8 {
		read, done, err := w.scanAtOpen(src, tip, record)
		if err != nil {
			return err
		}
		if done || depth > openScanLimit {
			if !done {
				w.log.Warn("the branch's newest commits that no resume cursor may show yet reach deeper than the worker reads; a replayed version older than them may be committed again",
					"commits", read)
			}
			if len(w.held) > 0 {
				w.log.Info("the branch holds versions committed by other writers of its slot; changes of them, or of older versions, are not committed again",
					"commits", read, "objects", len(w.held))
			}
			return nil
		}
		// The walk needs commits the clone did not bring: fetch the history, commits only.
		hist := memory.NewStorage()
		if _, err := w.fetchHistory(ctx, hist, tip, min(depth, openScanLimit)); err != nil {
			return fmt.Errorf("read the branch's recent commits: %w", err)
		}
		src = hist
	}
}

// scanAtOpen walks the first parents from tip in s (takeInAtOpen), taking in what each commit
// carries. done is false when it needs a commit s does not hold.
func (w *Worker) scanAtOpen(s storer.EncodedObjectStorer, tip plumbing.Hash, record func(int64) (*pushDelivery, error)) (read int, done bool, err error) {
	w.held = onBranch{}
	var push *pushDelivery // the last push being read, down to its base
	foreign := 0           // someone else's commits read since the last push
	for h := tip; read < openScanLimit; read++ {
		if push != nil && h.String() == push.Base {
			// The base of a last push: read on only when it is the tip of its own writer's last
			// push, which the record says without the commit.
			if push.BaseEpoch > 0 {
				rec, err := record(push.BaseEpoch)
				if err != nil {
					return read, false, err
				}
				if rec == nil || rec.SHA != push.Base {
					return read, true, nil
				}
			}
			push = nil
		}
		c, err := object.GetCommit(s, h)
		if err != nil {
			return read, false, nil
		}
		own := w.held.hold(c, w.opts.WriterSlot, w.currentSigner())
		switch {
		case push != nil:
		case !own:
			if foreign++; foreign >= openForeignLimit {
				return read + 1, true, nil // no recent push of the slot below someone else's commits
			}
		default:
			// The newest commit of the slot outside a push being read: the tip of its writer's
			// last push, when its record says so; then that push is read down to its base.
			rec, err := record(commitEpoch(c.Message, w.opts.WriterSlot))
			if err != nil {
				return read, false, err
			}
			if rec == nil || rec.SHA != h.String() {
				return read + 1, true, nil // a push whose cursors were advanced: the end
			}
			push, foreign = rec, 0 // a push that created the branch (no base) is read to the root
		}
		if len(c.ParentHashes) == 0 {
			return read + 1, true, nil
		}
		h = c.ParentHashes[0]
	}
	return read, false, nil
}
