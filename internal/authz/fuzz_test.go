package authz

import (
	"testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// FuzzDecodeReview: whatever the body, decodeReview returns a review or an error, never
// panics, and a review it accepts has what the handler relies on.
func FuzzDecodeReview(f *testing.F) {
	f.Add(reviewBody(f, "alice", commitRequest("tenants", nil), false))
	f.Add(reviewBody(f, "alice", commitRequest("tenants", &v1alpha1.Identity{Name: "J", Email: "j@x"}), true))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","operation":"CREATE","kind":{"group":"kubescribe.dev","kind":"CommitRequest"},"object":null}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","operation":"CREATE","kind":{"group":"kubescribe.dev","kind":"CommitRequest"},"object":{"metadata":{"uid":"u"}}}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rv, err := decodeReview(body)
		if err != nil {
			if rv != nil {
				t.Fatal("a review and an error")
			}
			return
		}
		if rv.req == nil || rv.req.UID == "" {
			t.Fatal("accepted a review without request uid")
		}
		if rv.obj != nil && (rv.obj.UID == "" || rv.req.UserInfo.Username == "") {
			t.Fatal("accepted a CommitRequest without uid or submitter")
		}
	})
}
