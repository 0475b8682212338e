package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// Caps on the userInfo a candidate may carry. The apiserver copies the authenticated user's
// groups and extra into every review, and an authenticator (an OIDC provider, a front proxy)
// may hand out many; a candidate past a cap is refused (counted as user_too_large) rather
// than trimmed, because a trimmed identity is not the one the apiserver authenticated.
const (
	// MaxUserGroups is the most groups a candidate's user may have.
	MaxUserGroups = 256
	// MaxUserExtra is the most extra keys a candidate's user may have.
	MaxUserExtra = 32
	// MaxUserBytes bounds the user's username, uid, groups and extra keys and values together.
	MaxUserBytes = 16 << 10
)

// candidateOverhead is what candidateSize counts for a candidate's fixed fields and slices.
const candidateOverhead = 256

// candidateSize is about how many bytes a queued candidate holds.
func candidateSize(c *Candidate) int64 {
	n := candidateOverhead + len(c.Route) + len(c.Group) + len(c.Resource) + len(c.Subresource) + len(c.Namespace) + len(c.Name) +
		len(c.UID) + len(c.Operation) + len(c.BaseResourceVersion) + len(c.Digest) + len(c.RequestUID) + userBytes(&c.User)
	return int64(n)
}

// userBytes is the size of an identity's strings.
func userBytes(u *audit.Identity) int {
	n := len(u.Username) + len(u.UID)
	for _, g := range u.Groups {
		n += len(g) + 16
	}
	for k, vs := range u.Extra {
		n += len(k) + 16
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	return n
}

// checkUser refuses a userInfo past the caps; the error says which, never what it holds.
func checkUser(u *audit.Identity) error {
	switch {
	case len(u.Groups) > MaxUserGroups:
		return fmt.Errorf("userInfo has %d groups, more than %d", len(u.Groups), MaxUserGroups)
	case len(u.Extra) > MaxUserExtra:
		return fmt.Errorf("userInfo has %d extra keys, more than %d", len(u.Extra), MaxUserExtra)
	}
	if n := userBytes(u); n > MaxUserBytes {
		return fmt.Errorf("userInfo holds about %d bytes, more than %d", n, MaxUserBytes)
	}
	return nil
}

// completeCandidate turns a review for route into the candidate it claims, decoding its
// objects: the object's uid, name and declared-form digest (or a Scale's replicas), the old
// object's uid, name and resourceVersion. result is "" for a candidate, else the outcome to
// count (resultDryRun, resultIgnored, resultInvalid or resultUserTooLarge), with the reason
// for the last two.
func completeCandidate(route string, req *admissionv1.AdmissionRequest, render Render, secretDigest func([]byte) [32]byte) (Candidate, string, error) {
	if req.DryRun != nil && *req.DryRun {
		return Candidate{}, resultDryRun, nil
	}
	op := string(req.Operation)
	switch {
	case op != OpCreate && op != OpUpdate && op != OpDelete,
		req.SubResource != "" && req.SubResource != "scale",
		req.SubResource == "scale" && op != OpUpdate:
		return Candidate{}, resultIgnored, nil
	}
	digest := Digest
	if req.Resource.Group == "" && req.Resource.Resource == "secrets" && op != OpDelete {
		if secretDigest == nil {
			// A plain digest of what is written could be checked against guessed values:
			// without a key, nothing is kept of a Secret's write.
			return Candidate{}, resultIgnored, nil
		}
		digest = func(m []byte) string { return DigestOf(secretDigest(m)) }
	}
	c := Candidate{
		Route: route, Group: req.Resource.Group, Resource: req.Resource.Resource, Subresource: req.SubResource,
		Namespace: req.Namespace, Name: req.Name, Operation: op,
		User:       audit.Identity{Username: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups},
		RequestUID: string(req.UID), Received: time.Now(),
	}
	if len(req.UserInfo.Extra) > 0 {
		c.User.Extra = make(map[string][]string, len(req.UserInfo.Extra))
		for k, v := range req.UserInfo.Extra {
			c.User.Extra[k] = v
		}
	}
	if err := checkUser(&c.User); err != nil {
		return Candidate{}, resultUserTooLarge, err
	}
	if err := complete(&c, req.Object.Raw, req.OldObject.Raw, render, digest); err != nil {
		return Candidate{}, resultInvalid, err
	}
	return c, "", nil
}

// metaOnly is the part of an old object a candidate needs; decoding into it skips the rest.
type metaOnly struct {
	Metadata struct {
		Name            string `json:"name"`
		UID             string `json:"uid"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
}

// complete fills in c's uid, name, base resourceVersion and digest from the review's objects.
func complete(c *Candidate, object, oldObj []byte, render Render, digest func([]byte) string) error {
	if c.Operation != OpCreate {
		if len(oldObj) == 0 || string(oldObj) == "null" {
			return errors.New("the review carries no oldObject")
		}
		var old metaOnly
		if err := json.Unmarshal(oldObj, &old); err != nil {
			return fmt.Errorf("oldObject is not a Kubernetes object: %v", jsonReason(err))
		}
		c.UID, c.BaseResourceVersion = old.Metadata.UID, old.Metadata.ResourceVersion
		if c.BaseResourceVersion == "" {
			return errors.New("oldObject has no metadata.resourceVersion")
		}
		if c.Name == "" {
			c.Name = old.Metadata.Name
		}
	}
	if c.Operation == OpDelete {
		if c.UID == "" {
			return errors.New("oldObject has no metadata.uid")
		}
		return nil
	}
	obj, err := decodeObject(object, "object")
	if err != nil {
		return err
	}
	if uid := string(obj.GetUID()); uid != "" {
		c.UID = uid
	}
	if c.UID == "" {
		return errors.New("object has no metadata.uid")
	}
	if c.Name == "" {
		c.Name = obj.GetName() // a generateName create: the name is generated before admission
	}
	if c.Subresource == "scale" {
		r, found, err := unstructured.NestedInt64(obj.Object, "spec", "replicas")
		if err != nil {
			return fmt.Errorf("Scale object: spec.replicas: %v", err)
		}
		if !found {
			r = 0 // omitempty: a Scale to zero carries no replicas
		}
		c.Replicas = &r
		return nil
	}
	manifest, err := render(obj)
	if err != nil {
		return fmt.Errorf("declared form: %w", err)
	}
	c.Digest = digest(manifest)
	return nil
}

func decodeObject(raw []byte, field string) (*unstructured.Unstructured, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("the review carries no %s", field)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("%s is not a Kubernetes object: %v", field, err)
	}
	return u, nil
}

// jsonReason says what is wrong with a JSON document without quoting it.
func jsonReason(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON (syntax error at byte %d)", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q has the wrong type", typ.Field)
	}
	return "undecodable"
}
