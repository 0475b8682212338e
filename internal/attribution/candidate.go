package attribution

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
)

// Candidate facts (internal/admission), kept beside the audit facts, under the prefix P:
//
//	P:cand:<route>:<uid>:<base>   a list of candidate records: the writes admission saw
//	                              start from resourceVersion <base> ("-" for a create)
//
// Every candidate is appended (several users may attempt the same write; the join must see
// them all to refuse to guess) and the list expires CandidateTTL after its last append. A
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

// maxCandidates bounds how many candidates of one (object, base) are read.
const maxCandidates = 64

func (s *Store) candidateKey(route, uid, base string) string {
	if base == "" {
		base = "-"
	}
	return s.prefix.Key("cand", route, uid, base)
}

// StoreCandidates appends each candidate to its list and announces the objects, in one
// pipeline. It implements admission.CandidateStore.
func (s *Store) StoreCandidates(ctx context.Context, cs []admission.Candidate) error {
	if len(cs) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	ttl := s.candTTL
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
		key := s.candidateKey(c.Route, c.UID, c.BaseResourceVersion)
		pipe.RPush(ctx, key, rec)
		pipe.PExpire(ctx, key, ttl)
		if len(ann) > 0 {
			ann = append(ann, '\n')
		}
		ann = append(ann, c.Route...)
		ann = append(ann, '/')
		ann = append(ann, c.UID...)
	}
	pipe.Publish(ctx, s.channel(), ann)
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
func (s *Store) Candidates(ctx context.Context, route, uid, base string) ([]StoredCandidate, error) {
	vals, err := s.rdb.LRange(ctx, s.candidateKey(route, uid, base), 0, maxCandidates-1).Result()
	if err != nil {
		return nil, fmt.Errorf("looking up admission candidates: %w", err)
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
