package attribution

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
)

// Candidate facts (internal/admission), kept beside the audit facts, under the prefix P:
//
//	P:cand:<route>:<uid>:<base>   a list of candidate records: the writes admission saw
//	                              start from resourceVersion <base> ("-" for a create)
//
// Every candidate is appended (several users may attempt the same write; the join must see
// them all to refuse to guess), and the list is bounded: it keeps the first MaxCandidates+1
// records and drops later pushes (LTRIM in the same script call as the RPUSH), and it expires
// CandidateTTL after its FIRST append (the expiry is set only on a list that has none, so no
// stream of pushes keeps a list alive). A list holding more than MaxCandidates records is
// ambiguous: Candidates reports ErrTooManyCandidates and the join leaves the change
// unresolved, so that candidates nobody confirms can never push the real one out of sight. A
// stored candidate is announced on P:facts like a fact ("<route>/<uid>"), so a change waiting
// for its author wakes up.
//
// A record is one JSON object, version 1:
//
//	{"v":1,"op":"UPDATE","sub":"scale","digest":"<hex sha256>","replicas":3,
//	 "user":{"username":"bob",...},"request":"<AdmissionRequest uid>"}
//
// As for facts, a record of another version is not read (a newer kubescribe sharing Redis):
// the join treats it as no candidate.
type candidateRecordV1 struct {
	V        int        `json:"v"`
	Op       string     `json:"op"`
	Sub      string     `json:"sub,omitempty"`
	Resource string     `json:"resource,omitempty"`
	Group    string     `json:"group,omitempty"`
	Digest   string     `json:"digest,omitempty"`
	Replicas *int64     `json:"replicas,omitempty"`
	User     recordUser `json:"user"`
	Request  string     `json:"request,omitempty"`
}

// candidateVersion is the version of the candidate records this build writes.
const candidateVersion = 1

// MaxCandidates is how many candidates one (route, object uid, base resourceVersion) may have:
// one more is kept, as the mark of a list that overflowed, and the rest are dropped. No real
// write sees that many admission attempts from one version (each is a write of that version
// that the apiserver was asked for), so more is either a conflict storm or a flood, and is
// never guessed through.
const MaxCandidates = 64

// ErrTooManyCandidates is Candidates' answer for a list that holds more than MaxCandidates
// records: which of them describes the real write is unknowable.
var ErrTooManyCandidates = fmt.Errorf("more than %d admission candidates", MaxCandidates)

// storeCandidates appends candidate records and announces them, in one call. KEYS are the
// lists; ARGV[1] is the TTL in milliseconds, ARGV[2] how many records a list keeps, ARGV[3]
// the channel, ARGV[4] the announcement ("" for none) and ARGV[4+i] the record for KEYS[i].
// A list longer than ARGV[2] is trimmed back to its first ARGV[2] records; a list without an
// expiry gets one, and a list that has one keeps it.
var storeCandidates = redis.NewScript(`
local keep = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  if redis.call('RPUSH', key, ARGV[4 + i]) > keep then
    redis.call('LTRIM', key, 0, keep - 1)
  end
  if redis.call('PTTL', key) < 0 then
    redis.call('PEXPIRE', key, ARGV[1])
  end
end
if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
return #KEYS
`)

func (s *Store) candidateKey(route, uid, base string) string {
	if base == "" {
		base = "-"
	}
	return s.prefix.Key("cand", route, uid, base)
}

// StoreCandidates appends each candidate to its list and announces the objects, in one round
// trip (one script call; one pipeline of calls, one per list, on Redis Cluster). It
// implements admission.CandidateStore.
func (s *Store) StoreCandidates(ctx context.Context, cs []admission.Candidate) error {
	if len(cs) == 0 {
		return nil
	}
	keys := make([]string, 0, len(cs))
	recs := make([]any, 0, len(cs))
	var ann []byte
	for i := range cs {
		c := &cs[i]
		rec, err := json.Marshal(candidateRecordV1{
			V: candidateVersion, Op: c.Operation, Sub: c.Subresource, Resource: c.Resource, Group: c.Group,
			Digest: c.Digest, Replicas: c.Replicas, Request: c.RequestUID,
			User: recordUser{Username: c.User.Username, UID: c.User.UID, Groups: c.User.Groups, Extra: c.User.Extra},
		})
		if err != nil {
			return fmt.Errorf("encoding a candidate: %w", err)
		}
		keys = append(keys, s.candidateKey(c.Route, c.UID, c.BaseResourceVersion))
		recs = append(recs, rec)
		if len(ann) > 0 {
			ann = append(ann, '\n')
		}
		ann = append(ann, c.Route...)
		ann = append(ann, '/')
		ann = append(ann, c.UID...)
	}
	ttl, keep := s.candTTL.Milliseconds(), MaxCandidates+1
	if !s.cluster {
		args := append([]any{ttl, keep, s.channel(), ann}, recs...)
		if err := storeCandidates.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
			return fmt.Errorf("storing %d admission candidates: %w", len(cs), err)
		}
		return nil
	}
	pipe := s.rdb.Pipeline()
	for i, k := range keys {
		a := []byte(nil)
		if i == len(keys)-1 {
			a = ann
		}
		storeCandidates.Eval(ctx, pipe, []string{k}, ttl, keep, s.channel(), a, recs[i])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("storing %d admission candidates: %w", len(cs), err)
	}
	return nil
}

// StoredCandidate is a candidate as the join reads it back.
type StoredCandidate struct {
	Operation   string
	Subresource string
	Digest      string
	Replicas    *int64
	User        audit.Identity
	Request     string
}

// Candidates returns the candidates recorded for writes of object uid in cluster route that
// start from resourceVersion base ("" for creates). Records of an unknown version are skipped.
// A list that holds more than MaxCandidates records (of any version, readable or not) is
// ErrTooManyCandidates.
func (s *Store) Candidates(ctx context.Context, route, uid, base string) ([]StoredCandidate, error) {
	vals, err := s.rdb.LRange(ctx, s.candidateKey(route, uid, base), 0, MaxCandidates).Result()
	if err != nil {
		return nil, fmt.Errorf("looking up admission candidates: %w", err)
	}
	if len(vals) > MaxCandidates {
		return nil, ErrTooManyCandidates
	}
	out := make([]StoredCandidate, 0, len(vals))
	for _, v := range vals {
		var r candidateRecordV1
		if err := json.Unmarshal([]byte(v), &r); err != nil || r.V != candidateVersion {
			continue
		}
		out = append(out, StoredCandidate{
			Operation: r.Op, Subresource: r.Sub, Digest: r.Digest, Replicas: r.Replicas, Request: r.Request,
			User: audit.Identity{Username: r.User.Username, UID: r.User.UID, Groups: r.User.Groups, Extra: r.User.Extra},
		})
	}
	return out, nil
}
