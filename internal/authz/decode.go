package authz

import (
	"encoding/json"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// DefaultMaxBodyBytes limits an AdmissionReview body. It is above anything the apiserver can
// send, so that every CommitRequest it accepts gets a real verdict: a request body is at most
// 3 MiB (k8s.io/apiserver's --max-request-bytes default), the review carries the object once
// (a CREATE), re-encoded as JSON (which may write '<', '>' and '&' as 6-byte escapes, and
// only annotation values, at most 256 KiB, may hold them), plus the managedFields the
// apiserver adds (which repeat every label and annotation key) and the user's groups and
// extra. That stays below 3 x 3 MiB; 16 MiB leaves room. Only an authenticated apiserver is
// read at all.
const DefaultMaxBodyBytes int64 = 16 << 20

// review is a decoded CommitRequest AdmissionReview.
type review struct {
	req *admissionv1.AdmissionRequest
	// obj is the CommitRequest being created; nil for other operations.
	obj *v1alpha1.CommitRequest
}

// decodeReview decodes an admission.k8s.io/v1 AdmissionReview. Its errors say what is wrong
// without quoting the body.
func decodeReview(body []byte) (*review, error) {
	req, err := reviewhttp.DecodeRequest(body)
	if err != nil {
		return nil, err
	}
	rv := &review{req: req}
	if req.Operation != admissionv1.Create || req.Kind.Group != v1alpha1.GroupName || req.Kind.Kind != "CommitRequest" {
		return rv, nil
	}
	if len(req.Object.Raw) == 0 {
		return nil, errors.New("CREATE review of a CommitRequest carries no object")
	}
	var cr v1alpha1.CommitRequest
	if err := json.Unmarshal(req.Object.Raw, &cr); err != nil {
		return nil, fmt.Errorf("request.object is not a CommitRequest: %v", err)
	}
	if cr.UID == "" {
		return nil, errors.New("request.object has no metadata.uid")
	}
	if req.UserInfo.Username == "" {
		return nil, errors.New("AdmissionReview request has no userInfo.username")
	}
	rv.obj = &cr
	return rv, nil
}
