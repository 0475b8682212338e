package git

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/redis/go-redis/v9"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// A push and the advance of the resume cursors it covers are two writes to two systems: the
// Git server, then Redis (Router.onPushed). A writer killed between them (SIGKILL, OOM, a lost
// node, a few milliseconds after the server took the push) leaves the branch ahead of the
// cursors. Its heir replays the events since the cursors (watch/replay.go), and a version the
// branch holds already would be committed again; worse, an object whose push held two
// versions would have its older one written over the newer one, then the newer one again.
//
// So before each push, the worker records in Redis what the push delivers: the commit it makes
// the branch's tip and, for every change it covers, the object's version by folder. The record
// is the writer's own (keyed by its writer epoch, which its commits carry), so that two writers
// of a branch at once never overwrite each other's. A worker that opens the branch, or fetches
// it moved, reads the record of the epoch that made the tip; when the tip is that commit (or
// that commit's child) these versions are on the branch whatever the cursors say, and a
// replayed change of one of them, or of an older version of its object, makes no commit: it is
// settled, as a change the branch already holds, and its cursor advances with the next push.
//
// Only each writer's last push is recorded: the cursors of every earlier one were advanced before
// the next began (Router.onPushed runs before the worker goes on), unless Redis refused the
// advance, and then it refuses this record too.
//
// Keys owned by this file, under the prefix P:
//
//	P:pushed:<writer slot>:<branch>:<writer epoch>
//	    a pushDelivery (JSON) of the last push to the branch by the writer of that epoch of the
//	    slot (its GitProvider, "<namespace>/<name>"), expiring after deliveryTTL.

// deliveryVersion is the version of pushDelivery; a record of another version is ignored (no
// replayed change is then settled by it).
const deliveryVersion = 1

// deliveryTTL bounds how long a record is kept: far longer than a takeover takes.
const deliveryTTL = time.Hour

// maxDeliveryEntries bounds one record. A push of more changes (a first snapshot of a large
// folder) is recorded without its entries: an heir then settles nothing by it.
const maxDeliveryEntries = 20_000

// deliveryTimeout bounds one call to Redis.
const deliveryTimeout = 2 * time.Second

// pushDelivery is what a worker records before a push.
type pushDelivery struct {
	V int `json:"v"`
	// SHA is the commit the push makes the branch's tip.
	SHA string `json:"sha"`
	// Entries are the versions the push delivers, one per object and folder (the newest).
	Entries []pushedVersion `json:"entries,omitempty"`
	// Truncated: the push covered more than maxDeliveryEntries changes; Entries is empty.
	Truncated bool `json:"truncated,omitempty"`
}

// pushedVersion is one object's version a push delivered into a folder.
type pushedVersion struct {
	Folder string `json:"f"`
	Object string `json:"o"` // pushedObject
	RV     uint64 `json:"rv"`
}

// pushedObject names an object of a cluster the way a push record does.
func pushedObject(c attribution.AttributedChange) string {
	return c.Cluster + "\x00" + c.GVR.Group + "/" + c.GVR.Resource + "\x00" + c.Namespace + "/" + c.Name
}

// newDelivery is the record of a push that makes tip the branch's tip and delivers plans.
func newDelivery(tip plumbing.Hash, plans []*plan) pushDelivery {
	rec := pushDelivery{V: deliveryVersion, SHA: tip.String()}
	newest := map[[2]string]int{} // (folder, object) → index in Entries
	for _, p := range plans {
		folder := folderKey(p.targetPath)
		for _, c := range p.covered {
			rv, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
			if err != nil {
				continue // a sweep, or a version that is no number: nothing to compare with
			}
			k := [2]string{folder, pushedObject(c)}
			if i, ok := newest[k]; ok {
				rec.Entries[i].RV = max(rec.Entries[i].RV, rv)
				continue
			}
			if len(rec.Entries) == maxDeliveryEntries {
				return pushDelivery{V: deliveryVersion, SHA: rec.SHA, Truncated: true}
			}
			newest[k] = len(rec.Entries)
			rec.Entries = append(rec.Entries, pushedVersion{Folder: k[0], Object: k[1], RV: rv})
		}
	}
	return rec
}

// onBranch is what a worker knows the branch holds although no cursor may say so: the newest
// version of each object, by folder, that a lost writer's last push delivered.
type onBranch map[[2]string]uint64

// holds reports whether the branch holds c's version, or a newer one of its object, in the
// folder of targetPath.
func (b onBranch) holds(targetPath string, c attribution.AttributedChange) bool {
	if len(b) == 0 {
		return false
	}
	rv, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
	if err != nil {
		return false
	}
	pushed, ok := b[[2]string{folderKey(targetPath), pushedObject(c)}]
	return ok && rv <= pushed
}

// onBranchFrom reads rec against the branch's tip commit: its versions are on the branch when
// the tip is the recorded commit or one of its children. Nil otherwise.
func onBranchFrom(rec pushDelivery, tip *object.Commit) onBranch {
	if rec.V != deliveryVersion || tip == nil || len(rec.Entries) == 0 {
		return nil
	}
	sha := plumbing.NewHash(rec.SHA)
	if tip.Hash != sha && !slices.Contains(tip.ParentHashes, sha) {
		return nil
	}
	b := make(onBranch, len(rec.Entries))
	for _, e := range rec.Entries {
		b[[2]string{e.Folder, e.Object}] = e.RV
	}
	return b
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
// replayed as they always were.
func (w *Worker) recordPush(ctx context.Context) {
	if w.opts.Pushes == nil || w.opts.WriterSlot == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
	defer cancel()
	if err := w.opts.Pushes.record(ctx, w.opts.WriterSlot, w.opts.Branch, w.epoch, newDelivery(w.localTip, w.plans)); err != nil {
		w.log.Warn("cannot record the push in Redis; if this replica dies before the resume cursors advance, its successor may commit the push's changes again",
			"err", err)
	}
}

// readHeld reads the slot's last push record against the branch's tip, freshly fetched into
// store, and adds what it shows on the branch to Worker.held: at the first clone, and after
// each fetch that found the branch moved (another writer of the slot, the one this worker
// took over from, may have pushed since). A record Redis cannot give fails the clone, which is
// retried: without it, a replay could commit a version twice.
func (w *Worker) readHeld(ctx context.Context, store *memory.Storage, tip plumbing.Hash) error {
	if w.opts.Pushes == nil || w.opts.WriterSlot == "" || tip.IsZero() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, deliveryTimeout)
	defer cancel()
	c, err := object.GetCommit(store, tip)
	if err != nil {
		return fmt.Errorf("read the tip %s: %w", tip, err)
	}
	// The writer that made the tip, or, for someone else's commit on top, its parent, when the
	// store holds it (a fetch's history; a clone holds the tip alone).
	epoch := commitEpoch(c.Message, w.opts.WriterSlot)
	if epoch == 0 && len(c.ParentHashes) == 1 {
		if parent, err := object.GetCommit(store, c.ParentHashes[0]); err == nil {
			epoch = commitEpoch(parent.Message, w.opts.WriterSlot)
		}
	}
	rec, ok, err := w.opts.Pushes.last(ctx, w.opts.WriterSlot, w.opts.Branch, epoch)
	if errors.Is(err, errUnreadableDelivery) {
		w.log.Warn("ignoring the last push record: replayed changes its push delivered may be committed again", "writer_of_tip", epoch, "err", err)
		return nil
	}
	if err != nil || !ok {
		return err
	}
	held := onBranchFrom(rec, c)
	if len(held) == 0 {
		return nil
	}
	if w.held == nil {
		w.held = onBranch{}
	}
	for k, rv := range held {
		w.held[k] = max(w.held[k], rv)
	}
	w.log.Info("the branch holds the last recorded push; replayed changes it covers are not committed again",
		"push", rec.SHA, "objects", len(held))
	return nil
}
