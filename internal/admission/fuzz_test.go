package admission

import (
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kubescribe/kubescribe/internal/declared"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

func decodeReview(t testing.TB, body string) *admissionv1.AdmissionRequest {
	t.Helper()
	req, err := reviewhttp.DecodeRequest([]byte(body))
	if err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
	return req
}

// FuzzCandidate checks that no review makes the attribution webhook's decoding panic, and that
// what it accepts is a candidate the join can use: a known operation, an object uid, a base
// version for anything but a create, a digest or replicas for anything but a delete, and a
// user within the caps.
func FuzzCandidate(f *testing.F) {
	create, oldObj, newObj := fmt.Sprintf(configMap, "", "v1"), fmt.Sprintf(configMap, "7", "v1"), fmt.Sprintf(configMap, "7", "v2")
	scale := `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":"9"},"spec":{"replicas":3}}`
	for _, s := range []string{
		review("CREATE", "", create, "", false),
		review("UPDATE", "", newObj, oldObj, false),
		review("DELETE", "", "", oldObj, false),
		review("UPDATE", "scale", scale, scale, false),
		review("UPDATE", "scale", `{"kind":"Scale","metadata":{"uid":"u"},"spec":{"replicas":"3"}}`, scale, false),
		review("CREATE", "", create, "", true),
		review("CONNECT", "", "", "", false),
		review("UPDATE", "", `{"metadata":"nope"}`, `{"metadata":{"resourceVersion":7}}`, false),
		review("DELETE", "", "", `null`, false),
		review("CREATE", "", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"x-","uid":"u"}}`, "", false),
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"r","operation":"UPDATE","userInfo":{"groups":["a","b"],"extra":{"k":null}},"object":[],"oldObject":{}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := reviewhttp.DecodeRequest(body)
		if err != nil {
			return
		}
		c, result, err := completeCandidate("fuzz", req, declared.Manifest, nil)
		switch result {
		case "":
		case resultInvalid, resultUserTooLarge:
			if err == nil {
				t.Fatalf("result %s without a reason", result)
			}
			return
		case resultDryRun, resultIgnored:
			return
		default:
			t.Fatalf("unknown result %q", result)
		}
		if err != nil {
			t.Fatalf("a candidate and an error %v", err)
		}
		if c.Route != "fuzz" || c.UID == "" || c.RequestUID == "" {
			t.Fatalf("incomplete candidate %+v", c)
		}
		switch c.Operation {
		case OpCreate:
			if c.BaseResourceVersion != "" || len(c.Digest) != 64 {
				t.Fatalf("create candidate %+v", c)
			}
		case OpUpdate:
			if c.BaseResourceVersion == "" || (c.Subresource == "scale") != (c.Replicas != nil) || (c.Subresource == "") != (len(c.Digest) == 64) {
				t.Fatalf("update candidate %+v", c)
			}
		case OpDelete:
			if c.BaseResourceVersion == "" || c.Digest != "" {
				t.Fatalf("delete candidate %+v", c)
			}
		default:
			t.Fatalf("candidate of operation %q", c.Operation)
		}
		if checkUser(&c.User) != nil || candidateSize(&c) <= 0 {
			t.Fatalf("candidate user past the caps: %d groups, %d extra", len(c.User.Groups), len(c.User.Extra))
		}
	})
}
