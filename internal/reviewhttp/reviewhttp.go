// Package reviewhttp checks the HTTP side of an AdmissionReview request, the same way for both
// of kubescribe's admission webhooks (CommitRequests in internal/authz, attribution candidates
// in internal/admission): who may post, what content type, how large a body.
package reviewhttp

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// Body returns r's body. It answers the request itself, and returns false, for a content type
// other than JSON (415), a body over max bytes (413, whether announced or not), a body not
// received before a read deadline the caller set (408) and a body that cannot be read (400).
func Body(w http.ResponseWriter, r *http.Request, max int64) ([]byte, bool) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !isJSON(ct) {
		http.Error(w, fmt.Sprintf("content type %q: want application/json", ct), http.StatusUnsupportedMediaType)
		return nil, false
	}
	if r.ContentLength > max {
		http.Error(w, fmt.Sprintf("body exceeds %d bytes", max), http.StatusRequestEntityTooLarge)
		return nil, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil && r.ProtoMajor == 1 {
		// The connection is closed after the answer: net/http would otherwise read what is
		// left of the body first, for as long as its sender trickles it. (HTTP/2 resets the
		// stream alone; the connection may carry other reviews.)
		w.Header().Set("Connection", "close")
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// A read deadline the handler set (http.ResponseController) passed: the body came too
		// slowly.
		http.Error(w, "the body was not received in time", http.StatusRequestTimeout)
		return nil, false
	}
	if err != nil {
		http.Error(w, "unable to read body", http.StatusBadRequest)
		return nil, false
	}
	if int64(len(body)) > max {
		http.Error(w, fmt.Sprintf("body exceeds %d bytes", max), http.StatusRequestEntityTooLarge)
		return nil, false
	}
	return body, true
}

func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// CountStatus counts each request next answers in requests, by status code (200 when next
// wrote no header).
func CountStatus(requests *prometheus.CounterVec, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		code := ww.Status()
		if code == 0 {
			code = http.StatusOK
		}
		requests.WithLabelValues(strconv.Itoa(code)).Inc()
	})
}
