package authz

import (
	"encoding/json"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// DefaultMaxBodyBytes limits an AdmissionReview body. A CommitRequest is small (its message
// is at most 4 KiB); the review carries it once, with the user's groups and extra.
const DefaultMaxBodyBytes int64 = 256 << 10

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
