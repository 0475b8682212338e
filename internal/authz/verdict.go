// Package authz is the admission half of kubescribe: the validating webhook for CommitRequests
// (POST /validate/commitrequests). For every CommitRequest created it records who submitted it
// and, when the request asserts an author (spec.author), whether a SubjectAccessReview for the
// verb assert-author on the named GitTarget allowed that. The records (verdicts) live in Redis
// under the key prefix, keyed by the object's UID, with a TTL; this package owns their key and
// format. The controller reads them back: it is the real gate, the webhook is only the front
// door (failurePolicy Ignore).
package authz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// DefaultVerdictTTL is how long a verdict is kept. It must outlive the longest close delay of
// a CommitRequest (600s): the controller reads the verdict when the delay ends.
const DefaultVerdictTTL = 30 * time.Minute

// verdictVersion is the version of the stored format; a record of another version is treated as
// absent (the assertion is then ignored, never wrongly honoured).
const verdictVersion = 1

// Verdict is what admission recorded of one CommitRequest create.
type Verdict struct {
	// UID, Namespace and Name identify the CommitRequest.
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// Target is spec.targetRef.name as admitted.
	Target string `json:"target"`
	// Submitter is the authenticated user who created the request (AdmissionReview userInfo).
	Submitter Submitter `json:"submitter"`
	// Author is spec.author as admitted; nil when none was asserted.
	Author *Author `json:"author,omitempty"`
	// Authorized is true when Author is set and a SubjectAccessReview allowed the submitter to
	// assert-author on Target. False when no author was asserted, or the check could not be made.
	Authorized bool `json:"authorized"`
}

// Submitter is the user behind a request, as the apiserver authenticated them.
type Submitter struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}

// Author is an asserted Git identity.
type Author struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// storedVerdict is the stored format: a version, then the verdict.
type storedVerdict struct {
	Version int     `json:"v"`
	Verdict Verdict `json:"verdict"`
}

// Store keeps verdicts in Redis at <prefix>:authz:v1:verdict:<uid>, one JSON value per
// CommitRequest, with a TTL.
type Store struct {
	rdb    redis.Cmdable
	prefix keyspace.Prefix
	ttl    time.Duration
}

// NewStore returns a Store; ttl <= 0 means DefaultVerdictTTL.
func NewStore(rdb redis.Cmdable, prefix keyspace.Prefix, ttl time.Duration) *Store {
	if ttl <= 0 {
		ttl = DefaultVerdictTTL
	}
	return &Store{rdb: rdb, prefix: prefix, ttl: ttl}
}

// Key is the Redis key of uid's verdict.
func (s *Store) Key(uid types.UID) string {
	return s.prefix.Key("authz", fmt.Sprintf("v%d", verdictVersion), "verdict", string(uid))
}

// Record stores v unless a verdict for its UID exists already: the first record wins, so a
// later post for the same UID (a replayed or forged review) cannot replace what the apiserver's
// own review recorded.
func (s *Store) Record(ctx context.Context, v Verdict) error {
	if v.UID == "" {
		return errors.New("authz: a verdict needs the object's UID")
	}
	b, err := json.Marshal(storedVerdict{Version: verdictVersion, Verdict: v})
	if err != nil {
		return err
	}
	if err := s.rdb.SetArgs(ctx, s.Key(v.UID), b, redis.SetArgs{Mode: "NX", TTL: s.ttl}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("authz: recording the verdict of %s: %w", v.UID, err)
	}
	return nil
}

// Lookup returns uid's verdict; false when there is none (never recorded, expired, or of
// another format version).
func (s *Store) Lookup(ctx context.Context, uid types.UID) (Verdict, bool, error) {
	b, err := s.rdb.Get(ctx, s.Key(uid)).Bytes()
	if errors.Is(err, redis.Nil) {
		return Verdict{}, false, nil
	}
	if err != nil {
		return Verdict{}, false, fmt.Errorf("authz: reading the verdict of %s: %w", uid, err)
	}
	var sv storedVerdict
	if err := json.Unmarshal(b, &sv); err != nil || sv.Version != verdictVersion || sv.Verdict.UID != uid {
		return Verdict{}, false, nil
	}
	return sv.Verdict, true, nil
}
