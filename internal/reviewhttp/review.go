package reviewhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DecodeRequest decodes an admission.k8s.io/v1 AdmissionReview far enough to answer it: its
// request, which has a uid. Its errors say what is wrong without quoting the body (it may hold
// a Secret).
func DecodeRequest(body []byte) (*admissionv1.AdmissionRequest, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errors.New("empty body: want an admission.k8s.io/v1 AdmissionReview")
	}
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, fmt.Errorf("body is not an AdmissionReview: not JSON (syntax error at byte %d)", syn.Offset)
		}
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			return nil, fmt.Errorf("body is not an AdmissionReview: field %q has the wrong type", typ.Field)
		}
		return nil, errors.New("body is not an AdmissionReview")
	}
	if ar.APIVersion != admissionv1.SchemeGroupVersion.String() || ar.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("want apiVersion admission.k8s.io/v1 and kind AdmissionReview, got apiVersion %q kind %q", ar.APIVersion, ar.Kind)
	}
	if ar.Request == nil {
		return nil, errors.New("AdmissionReview has no request")
	}
	if ar.Request.UID == "" {
		return nil, errors.New("AdmissionReview request has no uid")
	}
	return ar.Request, nil
}

// Respond answers an AdmissionReview request with resp.
func Respond(w http.ResponseWriter, resp *admissionv1.AdmissionResponse) {
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil {
		http.Error(w, "encoding the response failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
