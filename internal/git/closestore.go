package git

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Keys owned by this package, all under the configured prefix P:
//
//	P:closes:<target namespace>/<target name>
//	    a hash: one field per close request (the CommitRequest's UID) a worker accepted, whose
//	    value is a closeRecord (JSON): the request, the changes of the window it closed and,
//	    once pushed, the commit. The hash expires closeRecordTTL after its last write.
//
// A CommitRequest's close is kept in Redis, not only in memory, so that it survives a restart:
// a window closed before kubescribe stops or is killed is committed again, with the request's
// message, when its GitTarget is routed after the restart (Router.Route), and a commit pushed
// by the stopping process is reported by the next one (Router.CloseResult).

// closeRecordVersion is the version of closeRecord; a record of another version is ignored (its
// request then ends as lost, as without the record).
const closeRecordVersion = 1

// closeRecordTTL bounds how long a close is kept: far longer than any restart, short enough
// that records of requests nobody finished do not pile up.
const closeRecordTTL = time.Hour

// maxCloseRecordBytes bounds one record (the window's declared forms): a window larger than
// that is not kept, and its request ends as lost if kubescribe restarts before the push.
const maxCloseRecordBytes = 8 << 20

// closeStoreTimeout bounds one call to Redis.
const closeStoreTimeout = 2 * time.Second

// CloseStore keeps the close requests workers accepted in Redis.
type CloseStore struct {
	rdb    redis.UniversalClient
	prefix keyspace.Prefix
}

// NewCloseStore returns a CloseStore.
func NewCloseStore(rdb redis.UniversalClient, prefix keyspace.Prefix) *CloseStore {
	return &CloseStore{rdb: rdb, prefix: prefix}
}

// closeRecord is what is kept of one accepted close request.
type closeRecord struct {
	V int `json:"v"`
	// Request is the close request (its Author asserted, when honoured).
	Request storedRequest `json:"request"`
	// Route is the destination the window was written for (route.id()): a record is replayed
	// only into the same destination.
	Route string `json:"route"`
	// Changes are the window's changes, in order.
	Changes []storedChange `json:"changes"`
	// SHA and Branch name the pushed commit, once pushed.
	SHA    string `json:"sha,omitempty"`
	Branch string `json:"branch,omitempty"`
	// Accepted is when the worker closed the window.
	Accepted time.Time `json:"accepted"`
}

type storedRequest struct {
	ID       string     `json:"id"`
	Username string     `json:"username"`
	Message  string     `json:"message"`
	Author   *Signature `json:"author,omitempty"`
	Request  string     `json:"request"`
}

type storedChange struct {
	Cluster         string         `json:"cluster"`
	Group           string         `json:"group,omitempty"`
	Version         string         `json:"version"`
	Resource        string         `json:"resource"`
	Namespace       string         `json:"namespace,omitempty"`
	Name            string         `json:"name"`
	UID             string         `json:"uid"`
	ResourceVersion string         `json:"rv"`
	Op              watch.Op       `json:"op"`
	Manifest        []byte         `json:"manifest,omitempty"`
	Observed        time.Time      `json:"observed"`
	Scope           string         `json:"scope,omitempty"`
	Destination     string         `json:"destination,omitempty"`
	Author          audit.Identity `json:"author"`
	Resolved        bool           `json:"resolved"`
	AuditID         string         `json:"auditID,omitempty"`
	Verb            string         `json:"verb,omitempty"`
	Source          string         `json:"source,omitempty"`
}

func (s *CloseStore) key(target types.NamespacedName) string {
	return s.prefix.Key("closes", target.String())
}

// newCloseRecord makes the record of req closing a window of changes written for route.
func newCloseRecord(req CloseRequest, route string, changes []attribution.AttributedChange, now time.Time) closeRecord {
	rec := closeRecord{
		V:        closeRecordVersion,
		Request:  storedRequest{ID: req.ID, Username: req.Username, Message: req.Message, Author: req.Author, Request: req.Request},
		Route:    route,
		Changes:  make([]storedChange, 0, len(changes)),
		Accepted: now,
	}
	for _, c := range changes {
		rec.Changes = append(rec.Changes, storedChange{
			Cluster: c.Cluster, Group: c.GVR.Group, Version: c.GVR.Version, Resource: c.GVR.Resource,
			Namespace: c.Namespace, Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion, Op: c.Op,
			Manifest: c.Manifest, Observed: c.Observed, Scope: c.Scope, Destination: c.Destination,
			Author: c.Author.Identity, Resolved: c.Author.Resolved, AuditID: c.Author.AuditID, Verb: c.Author.Verb, Source: c.Author.Source,
		})
	}
	return rec
}

// request is the close request rec records, for target.
func (rec *closeRecord) request(target types.NamespacedName) CloseRequest {
	r := rec.Request
	return CloseRequest{ID: r.ID, Target: target, Username: r.Username, Message: r.Message, Author: r.Author, Request: r.Request}
}

// changes are the window's changes rec records, for target.
func (rec *closeRecord) changes(target types.NamespacedName) []attribution.AttributedChange {
	out := make([]attribution.AttributedChange, 0, len(rec.Changes))
	for _, c := range rec.Changes {
		ch := watch.Change{
			Cluster: c.Cluster, Target: target, GVR: schema.GroupVersionResource{Group: c.Group, Version: c.Version, Resource: c.Resource},
			Namespace: c.Namespace, Name: c.Name, UID: c.UID, ResourceVersion: c.ResourceVersion, Op: c.Op,
			Manifest: c.Manifest, Observed: c.Observed, Scope: c.Scope, Destination: c.Destination,
		}
		out = append(out, attribution.AttributedChange{Change: ch, Author: attribution.Author{
			Identity: c.Author, Resolved: c.Resolved, AuditID: c.AuditID, Verb: c.Verb, Source: c.Source,
		}})
	}
	return out
}

// put writes rec for target.
func (s *CloseStore) put(ctx context.Context, target types.NamespacedName, rec closeRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if len(b) > maxCloseRecordBytes {
		return fmt.Errorf("the closed window's record is %d bytes, over the %d-byte bound", len(b), maxCloseRecordBytes)
	}
	key := s.key(target)
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, key, rec.Request.ID, b)
	pipe.PExpire(ctx, key, closeRecordTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("recording the close of commit request %s: %w", rec.Request.Request, err)
	}
	return nil
}

// pushed records that the request id of target was committed as sha on branch.
func (s *CloseStore) pushed(ctx context.Context, target types.NamespacedName, id, sha, branch string) error {
	rec, ok, err := s.get(ctx, target, id)
	if err != nil || !ok {
		return err
	}
	rec.SHA, rec.Branch = sha, branch
	rec.Changes = nil // nothing to replay any more
	return s.put(ctx, target, rec)
}

// get reads the record of the request id of target.
func (s *CloseStore) get(ctx context.Context, target types.NamespacedName, id string) (closeRecord, bool, error) {
	b, err := s.rdb.HGet(ctx, s.key(target), id).Bytes()
	if errors.Is(err, redis.Nil) {
		return closeRecord{}, false, nil
	}
	if err != nil {
		return closeRecord{}, false, fmt.Errorf("reading the close of commit request %s: %w", id, err)
	}
	var rec closeRecord
	if json.Unmarshal(b, &rec) != nil || rec.V != closeRecordVersion || rec.Request.ID != id {
		return closeRecord{}, false, nil
	}
	return rec, true, nil
}

// all reads the records of target, oldest first; records past closeRecordTTL are removed.
func (s *CloseStore) all(ctx context.Context, target types.NamespacedName, now time.Time) ([]closeRecord, error) {
	vals, err := s.rdb.HGetAll(ctx, s.key(target)).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the closes of GitTarget %s: %w", target, err)
	}
	var recs []closeRecord
	var stale []string
	for id, v := range vals {
		var rec closeRecord
		if json.Unmarshal([]byte(v), &rec) != nil || rec.V != closeRecordVersion || rec.Request.ID != id || now.Sub(rec.Accepted) > closeRecordTTL {
			stale = append(stale, id)
			continue
		}
		recs = append(recs, rec)
	}
	if len(stale) > 0 {
		_ = s.rdb.HDel(ctx, s.key(target), stale...).Err() // best effort: they expire anyway
	}
	slices.SortFunc(recs, func(a, b closeRecord) int { return a.Accepted.Compare(b.Accepted) })
	return recs, nil
}

// forget removes the record of the request id of target.
func (s *CloseStore) forget(ctx context.Context, target types.NamespacedName, id string) error {
	return s.rdb.HDel(ctx, s.key(target), id).Err()
}
