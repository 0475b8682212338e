package authz

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/redis/go-redis/v9"
	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// Secret references. A GitProvider (spec.secretRef, spec.signing.secretRef) and a GitTarget
// (spec.sourceCluster.kubeConfigSecretRef) name Secrets of their namespace that kubescribe
// reads with its own rights and uses on the object's behalf: it sends a Git password to the
// URL of the spec, connects with a kubeconfig. A GitTarget with spec.encryption has every
// Secret its rules select written to Git for recipients the spec chose. So kubescribe uses
// them only for a spec that someone who may read them vouched for: the webhook at
// SecretRefsPath runs a SubjectAccessReview for the user creating or updating the object (get
// on each Secret named, list on Secrets when the target encrypts them) and records a positive
// verdict keyed by the object's UID and the digest of its spec. The controller, the real gate,
// uses the references only of a spec with such a verdict.

// SecretRefsPath is where the reviews of GitProviders and GitTargets are served; SecretRefsPath
// + "/<token>" too.
const SecretRefsPath = "/validate/secretrefs"

// SecretRefs are what an object asks kubescribe to read of the Secrets of its namespace: the
// Secrets it names (read with get), and whether its rules' Secrets go to Git (list).
type SecretRefs struct {
	// Get are the names of the Secrets the object names, sorted, each once.
	Get []string `json:"get,omitempty"`
	// List is set when the object has kubescribe write the namespace's Secrets to Git
	// (a GitTarget with spec.encryption).
	List bool `json:"list,omitempty"`
}

// Empty reports whether the object asks for no Secret.
func (r SecretRefs) Empty() bool { return len(r.Get) == 0 && !r.List }

// Covers reports whether a verdict of r vouches for want: every Secret of want checked, and list
// if want needs it.
func (r SecretRefs) Covers(want SecretRefs) bool {
	if want.List && !r.List {
		return false
	}
	for _, name := range want.Get {
		if !slices.Contains(r.Get, name) {
			return false
		}
	}
	return true
}

func refsOf(names ...string) []string {
	var out []string
	for _, n := range names {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// ProviderSecretRefs are the Secrets a GitProvider names: its credentials and signing key.
func ProviderSecretRefs(p *v1alpha1.GitProvider) SecretRefs {
	var creds, signing string
	if p.Spec.SecretRef != nil {
		creds = p.Spec.SecretRef.Name
	}
	if p.Spec.Signing != nil {
		signing = p.Spec.Signing.SecretRef.Name
	}
	return SecretRefs{Get: refsOf(creds, signing)}
}

// TargetSecretRefs are the Secrets a GitTarget names (its remote cluster's kubeconfig), and
// list when it encrypts Secrets into Git for recipients of its own.
func TargetSecretRefs(t *v1alpha1.GitTarget) SecretRefs {
	var kc string
	if t.Spec.SourceCluster != nil {
		kc = t.Spec.SourceCluster.KubeConfigSecretRef.Name
	}
	return SecretRefs{Get: refsOf(kc), List: t.Spec.Encryption != nil}
}

// SpecDigest is the hex SHA-256 of a spec's JSON encoding: what a verdict vouches for. The
// webhook and the controller both encode the typed spec, so they agree on it.
func SpecDigest(spec any) (string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// SecretRefVerdict records that User, who may read Refs, created or updated the object UID
// with the spec of digest Digest. Only positive verdicts are recorded.
type SecretRefVerdict struct {
	UID       types.UID  `json:"uid"`
	Kind      string     `json:"kind"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Digest    string     `json:"digest"`
	User      string     `json:"user"`
	Refs      SecretRefs `json:"refs"`
}

// SecretRefStore keeps the verdicts of Secret references in Redis: one hash per object at
// <prefix>:authz:v1:secretrefs:<uid>, a field per spec digest holding the JSON verdict. Keys
// have no TTL: a verdict is needed as long as its object keeps that spec. The controller removes
// the other digests once it verified one, and the key when the object is deleted.
type SecretRefStore struct {
	rdb    redis.Cmdable
	prefix keyspace.Prefix
}

// NewSecretRefStore returns a SecretRefStore.
func NewSecretRefStore(rdb redis.Cmdable, prefix keyspace.Prefix) *SecretRefStore {
	return &SecretRefStore{rdb: rdb, prefix: prefix}
}

// Key is the Redis key of uid's verdicts.
func (s *SecretRefStore) Key(uid types.UID) string {
	return s.prefix.Key("authz", fmt.Sprintf("v%d", verdictVersion), "secretrefs", string(uid))
}

// RecordSecretRefs stores v unless a verdict for its UID and digest exists already (the first
// wins).
func (s *SecretRefStore) RecordSecretRefs(ctx context.Context, v SecretRefVerdict) error {
	if v.UID == "" || v.Digest == "" {
		return errors.New("authz: a Secret reference verdict needs the object's UID and spec digest")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := s.rdb.HSetNX(ctx, s.Key(v.UID), v.Digest, b).Err(); err != nil {
		return fmt.Errorf("authz: recording the Secret reference verdict of %s: %w", v.UID, err)
	}
	return nil
}

// LookupSecretRefs returns the verdict of uid's spec of digest; false when there is none.
func (s *SecretRefStore) LookupSecretRefs(ctx context.Context, uid types.UID, digest string) (SecretRefVerdict, bool, error) {
	b, err := s.rdb.HGet(ctx, s.Key(uid), digest).Bytes()
	if errors.Is(err, redis.Nil) {
		return SecretRefVerdict{}, false, nil
	}
	if err != nil {
		return SecretRefVerdict{}, false, fmt.Errorf("authz: reading the Secret reference verdict of %s: %w", uid, err)
	}
	var v SecretRefVerdict
	if err := json.Unmarshal(b, &v); err != nil || v.UID != uid || v.Digest != digest {
		return SecretRefVerdict{}, false, nil
	}
	return v, true, nil
}

// ForgetSecretRefs removes uid's verdicts but the one of digest keep; every one when keep is "".
func (s *SecretRefStore) ForgetSecretRefs(ctx context.Context, uid types.UID, keep string) error {
	key := s.Key(uid)
	if keep == "" {
		return s.rdb.Del(ctx, key).Err()
	}
	fields, err := s.rdb.HKeys(ctx, key).Result()
	if err != nil {
		return err
	}
	fields = slices.DeleteFunc(fields, func(f string) bool { return f == keep })
	if len(fields) == 0 {
		return nil
	}
	return s.rdb.HDel(ctx, key, fields...).Err()
}

// SecretRefRecorder stores Secret reference verdicts; SecretRefStore implements it.
type SecretRefRecorder interface {
	RecordSecretRefs(ctx context.Context, v SecretRefVerdict) error
}

// secretRefObject is a decoded GitProvider or GitTarget of a review: its references and the
// digest of its spec.
type secretRefObject struct {
	uid    types.UID
	refs   SecretRefs
	digest string
}

func decodeSecretRefObject(kind string, raw []byte) (*secretRefObject, error) {
	var (
		meta metav1.ObjectMeta
		refs SecretRefs
		spec any
	)
	switch kind {
	case "GitProvider":
		var p v1alpha1.GitProvider
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("not a GitProvider: %v", err)
		}
		meta, refs, spec = p.ObjectMeta, ProviderSecretRefs(&p), p.Spec
	case "GitTarget":
		var t v1alpha1.GitTarget
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, fmt.Errorf("not a GitTarget: %v", err)
		}
		meta, refs, spec = t.ObjectMeta, TargetSecretRefs(&t), t.Spec
	default:
		return nil, nil
	}
	digest, err := SpecDigest(spec)
	if err != nil {
		return nil, err
	}
	return &secretRefObject{uid: meta.UID, refs: refs, digest: digest}, nil
}

// serveSecretRefs is the webhook of GitProviders and GitTargets (CREATE and UPDATE): it refuses
// a spec naming a Secret the requester may not get, or encrypting Secrets when the requester may
// not list them, and records a positive verdict otherwise. An update that leaves the spec as it
// was is never refused (a label, an annotation), and records a verdict when its requester may
// read the Secrets: how an object admitted without one (the webhook was down) is verified.
func (h *handler) serveSecretRefs(w http.ResponseWriter, r *http.Request) {
	caller, ok := h.opts.Auth.Authenticate(w, r, h.log, webhookName, chi.URLParam(r, "token"))
	if !ok || !h.opts.Auth.Permit(w, r, h.log, webhookName, caller, h.opts.Route) {
		return
	}
	body, ok := reviewhttp.Body(w, r, h.opts.MaxBodyBytes)
	if !ok {
		return
	}
	req, err := reviewhttp.DecodeRequest(body)
	if err != nil {
		h.log.Warn("undecodable admission review", "err", err, "bytes", len(body))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := h.reviewSecretRefs(r.Context(), req)
	if err != nil {
		h.log.Warn("undecodable admission review", "err", err, "bytes", len(body))
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	reviewhttp.Respond(w, resp)
}

func (h *handler) reviewSecretRefs(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != v1alpha1.GroupName || (req.Operation != admissionv1.Create && req.Operation != admissionv1.Update) {
		return resp, nil
	}
	obj, err := decodeSecretRefObject(req.Kind.Kind, req.Object.Raw)
	if err != nil || obj == nil {
		return resp, err
	}
	if obj.uid == "" || req.UserInfo.Username == "" {
		return nil, errors.New("request.object has no metadata.uid, or the request no userInfo.username")
	}
	if obj.refs.Empty() {
		return resp, nil // names no Secret: nothing to vouch for
	}
	specChanged := true
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		if old, err := decodeSecretRefObject(req.Kind.Kind, req.OldObject.Raw); err == nil && old != nil && old.digest == obj.digest {
			specChanged = false
		}
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	log := h.log.With("kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "uid", string(obj.uid), "user", req.UserInfo.Username)
	user := Submitter{Username: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups}
	if len(req.UserInfo.Extra) > 0 {
		user.Extra = make(map[string][]string, len(req.UserInfo.Extra))
		for k, e := range req.UserInfo.Extra {
			user.Extra[k] = e
		}
	}
	denied, err := h.mayReadSecrets(ctx, user, req.Namespace, obj.refs)
	switch {
	case err != nil:
		log.Warn("the Secret reference check failed; the object stays unverified", "err", err)
		resp.Warnings = append(resp.Warnings, "kubescribe could not check that you may read the Secrets this object names: it will not use them (SecretReferenceUnverified) until someone who may read them updates the object")
		return resp, nil
	case denied != "":
		if !specChanged {
			return resp, nil // a metadata change by someone else: neither refused nor vouched for
		}
		log.Info("Secret reference refused", "missing", denied)
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden,
			Message: SecretRefDeniedMessage(req.UserInfo.Username, req.Kind.Kind, req.Namespace, denied)}
		return resp, nil
	}
	if req.DryRun != nil && *req.DryRun {
		return resp, nil
	}
	v := SecretRefVerdict{UID: obj.uid, Kind: req.Kind.Kind, Namespace: req.Namespace, Name: req.Name, Digest: obj.digest,
		User: req.UserInfo.Username, Refs: obj.refs}
	if h.opts.SecretRefs == nil {
		return resp, nil
	}
	if err := h.opts.SecretRefs.RecordSecretRefs(ctx, v); err != nil {
		log.Error("recording the Secret reference verdict failed; the object stays unverified", "err", err)
		resp.Warnings = append(resp.Warnings, "kubescribe could not record that you may read the Secrets this object names: it will not use them (SecretReferenceUnverified) until the object is updated again")
		return resp, nil
	}
	log.Info("Secret references vouched for", "secrets", strings.Join(obj.refs.Get, ","), "list", obj.refs.List)
	return resp, nil
}

// mayReadSecrets asks, with SubjectAccessReviews, whether user may get each Secret of refs in
// namespace, and list Secrets there when refs.List. It returns what is missing ("get Secret
// \"x\"", "list Secrets"), "" when nothing is.
func (h *handler) mayReadSecrets(ctx context.Context, user Submitter, namespace string, refs SecretRefs) (string, error) {
	check := func(verb, name string) (bool, error) {
		sar := SubjectAccessReview(user, namespace, "")
		sar.Spec.ResourceAttributes = &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Version: "v1", Resource: "secrets", Name: name}
		res, err := h.opts.Reviewer.Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("SubjectAccessReview: %w", err)
		}
		return res.Status.Allowed, nil
	}
	for _, name := range refs.Get {
		ok, err := check("get", name)
		if err != nil {
			return "", err
		}
		if !ok {
			return fmt.Sprintf("get on Secret %q", name), nil
		}
	}
	if refs.List {
		ok, err := check("list", "")
		if err != nil {
			return "", err
		}
		if !ok {
			return "list on Secrets (spec.encryption writes the namespace's Secrets to Git for the spec's recipients)", nil
		}
	}
	return "", nil
}

// SecretRefDeniedMessage is the refusal of an object naming a Secret its requester may not read.
func SecretRefDeniedMessage(user, kind, namespace, missing string) string {
	return fmt.Sprintf("user %q may not create or change this %s: it has kubescribe read Secrets of namespace %q with kubescribe's own rights, "+
		"so it needs your right to read them, and you lack %s in namespace %q; ask someone who may read the Secret to create it, or name a Secret you may read",
		user, kind, namespace, missing, namespace)
}
