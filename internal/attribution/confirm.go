package attribution

import (
	"context"
	"errors"
	"fmt"

	yaml "go.yaml.in/yaml/v3"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Source says where a cluster's authors come from.
type Source string

// The attribution sources of a cluster.
const (
	// SourceAudit: audit facts only (the apiserver's audit webhook points at kubescribe).
	SourceAudit Source = "audit"
	// SourceAdmission: admission candidates only, each confirmed by the watch (managed
	// clusters, where the audit flags are out of reach).
	SourceAdmission Source = "admission"
	// SourceBoth: an audit fact when one arrives within the grace window, else a confirmed
	// candidate.
	SourceBoth Source = "both"
)

// ParseSource reads an attribution source.
func ParseSource(s string) (Source, error) {
	switch Source(s) {
	case SourceAudit, SourceAdmission, SourceBoth:
		return Source(s), nil
	}
	return "", fmt.Errorf("attribution source %q is not one of audit, admission, both", s)
}

func (s Source) audit() bool     { return s != SourceAdmission }
func (s Source) admission() bool { return s == SourceAdmission || s == SourceBoth }

// candidateSource is what the joiner needs to read admission candidates; Store implements it.
type candidateSource interface {
	Candidates(ctx context.Context, route, uid, base string) ([]StoredCandidate, error)
}

// SetSource sets the attribution source of cluster (an audit route); clusters never set use
// JoinerOptions.Source. Changes already waiting keep the source they started with.
func (j *Joiner) SetSource(cluster string, s Source) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sources[cluster] = s
}

func (j *Joiner) sourceOf(cluster string) Source {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s, ok := j.sources[cluster]; ok {
		return s
	}
	return j.source
}

// confirmation is what the candidates of a change say.
type confirmation int

const (
	unconfirmed confirmation = iota // no candidate matches (yet)
	confirmed                       // candidates of exactly one user match
	ambiguous                       // candidates of different users match: never a guess
	overflowed                      // more than MaxCandidates candidates: never a guess
)

// confirm looks for the admission candidates that describe exactly the write c observed: same
// object uid, a base resourceVersion equal to the version the informer held before c, and
// the same declared form (for a scale, the same replicas; for a delete, a DELETE). A change
// found by a list has no base: nothing confirms it. A base with more candidates than
// MaxCandidates is overflowed, whatever they say.
func (j *Joiner) confirm(c watch.Change) (confirmation, Author) {
	if j.candidates == nil || c.Snapshot {
		return unconfirmed, Author{}
	}
	var bases []string
	switch c.Op {
	case watch.OpCreate:
		bases = []string{""}
	case watch.OpUpdate:
		if c.BaseResourceVersion == "" {
			return unconfirmed, Author{}
		}
		bases = []string{c.BaseResourceVersion}
	case watch.OpDelete:
		for _, b := range []string{c.BaseResourceVersion, c.DeletionBaseResourceVersion} {
			if b != "" && (len(bases) == 0 || bases[0] != b) {
				bases = append(bases, b)
			}
		}
	}
	digest := admission.DigestOf(c.Digest)
	var match *StoredCandidate
	users := map[string]bool{}
	for _, base := range bases {
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		cands, err := j.candidates.Candidates(ctx, c.Cluster, c.UID, base)
		cancel()
		if errors.Is(err, ErrTooManyCandidates) {
			return overflowed, Author{}
		}
		if err != nil {
			j.log.Warn("admission candidate lookup failed", "err", err, "uid", c.UID)
			if j.metrics != nil {
				j.metrics.lookupErrors.Inc()
			}
			continue
		}
		for i := range cands {
			if !matches(&cands[i], c, digest) {
				continue
			}
			if match == nil {
				match = &cands[i]
			}
			users[cands[i].User.Username] = true
		}
	}
	switch {
	case len(users) > 1:
		return ambiguous, Author{}
	case match != nil:
		return confirmed, Author{Identity: match.User, Resolved: true, Verb: candidateVerb(match), Source: string(SourceAdmission)}
	}
	return unconfirmed, Author{}
}

// matches reports whether candidate k describes the write of c (its base already matched).
func matches(k *StoredCandidate, c watch.Change, digest string) bool {
	switch c.Op {
	case watch.OpCreate:
		return k.Operation == admission.OpCreate && k.Subresource == "" && k.Digest == digest
	case watch.OpUpdate:
		if k.Operation != admission.OpUpdate {
			return false
		}
		if k.Subresource == "scale" {
			r, ok := replicasOf(c.Manifest)
			return ok && k.Replicas != nil && *k.Replicas == r
		}
		return k.Subresource == "" && k.Digest == digest
	case watch.OpDelete:
		return k.Operation == admission.OpDelete
	}
	return false
}

// replicasOf reads spec.replicas of a declared-form manifest.
func replicasOf(manifest []byte) (int64, bool) {
	var m struct {
		Spec struct {
			Replicas *int64 `yaml:"replicas"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(manifest, &m); err != nil || m.Spec.Replicas == nil {
		return 0, false
	}
	return *m.Spec.Replicas, true
}

func candidateVerb(k *StoredCandidate) string {
	switch k.Operation {
	case admission.OpCreate:
		return "create"
	case admission.OpDelete:
		return "delete"
	}
	return "update"
}
