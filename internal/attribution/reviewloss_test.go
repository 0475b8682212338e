package attribution

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// renderJSON is the tests' declared form: the object's JSON, the same for the review and the
// watch.
func renderJSON(u *unstructured.Unstructured) ([]byte, error) { return u.MarshalJSON() }

const (
	lossOld = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"app","namespace":"team","uid":"u1","resourceVersion":"8"},"data":{"k":"v1"}}`
	lossNew = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"app","namespace":"team","uid":"u1","resourceVersion":"8"},"data":{"k":"v2"}}`
)

// updateReview is the AdmissionReview of user's update of the ConfigMap from lossOld to lossNew.
func updateReview(t *testing.T, user string) []byte {
	t.Helper()
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("req-" + user), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: "team", Name: "app",
			Operation: admissionv1.Update, UserInfo: authenticationv1.UserInfo{Username: user},
			Object: runtime.RawExtension{Raw: []byte(lossNew)}, OldObject: runtime.RawExtension{Raw: []byte(lossOld)},
		},
	})
	require.NoError(t, err)
	return b
}

// lossChange is the watch's view of the update: base 8, new version 9, the same declared form.
func lossChange(t *testing.T) watch.Change {
	u := &unstructured.Unstructured{}
	require.NoError(t, u.UnmarshalJSON([]byte(lossNew)))
	m, err := renderJSON(u)
	require.NoError(t, err)
	return watch.Change{Cluster: "local", UID: "u1", Namespace: "team", Name: "app", ResourceVersion: "9", BaseResourceVersion: "8",
		Op: watch.OpUpdate, Manifest: m, Digest: sha256.Sum256(m), Observed: time.Now()}
}

// lossStack is a replica's attribution webhook and join on a real Redis, with small bounds: a
// review of at most 64 KiB, 256 KiB in flight, 128 KiB of it per credential, a body allowed
// 200ms plus 1 MiB/s.
type lossStack struct {
	store  *Store
	losses *admission.Losses
	srv    *httptest.Server
	joiner *Joiner
	token  string // the route's attribution token: the apiserver's, and the attacker's
	reg    *prometheus.Registry
}

func startLossStack(t *testing.T) *lossStack {
	t.Helper()
	rdb := startRedis(t)
	s := &lossStack{store: NewStore(rdb, keyspace.MustParse("test:loss:"), time.Minute), reg: prometheus.NewRegistry()}
	s.losses = admission.NewLosses(s.store)
	secret := []audit.Token{{Value: []byte("route-secret"), Routes: []string{"local"}, Line: 1}}
	s.token = reviewhttp.WebhookToken(secret[0].Value, reviewhttp.WebhookAttribution)
	h, err := admission.NewHandler(admission.HandlerOptions{
		Store: s.store, Render: renderJSON, Losses: s.losses,
		Auth:         &reviewhttp.Auth{Callers: audit.Authenticator{LocalRoute: "local", Tokens: secret}},
		MaxBodyBytes: 64 << 10, InFlightBytes: 256 << 10, BodyWait: 100 * time.Millisecond,
		BodyGrace: 200 * time.Millisecond, BodyMinRate: 1 << 20,
		Metrics: admission.NewMetrics(s.reg),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.Run(ctx)
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	s.joiner, err = NewJoiner(JoinerOptions{Facts: s.store, Candidates: s.store, Source: SourceAdmission, Grace: 10 * time.Second,
		ReviewLosses: s.losses})
	require.NoError(t, err)
	go func() { _ = s.joiner.Run(ctx) }()
	return s
}

// post sends body as a review for the local route with the route's token, and returns the
// status code.
func (s *lossStack) post(t *testing.T, body []byte) int {
	t.Helper()
	resp, err := http.Post(s.srv.URL+admission.PathPrefix+"local/"+s.token, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode
}

// holder announces a body of the largest size and trickles it a byte at a time, to keep its
// share of the in-flight budget, until the connection ends; answer gets the status line
// kubescribe answered, or the error that ended the connection. Closing the returned
// connection ends it.
func (s *lossStack) holder(t *testing.T, answer chan<- string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.srv.URL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "POST %slocal/%s HTTP/1.1\r\nHost: kubescribe\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
		admission.PathPrefix, s.token, 64<<10)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		defer close(done)
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			answer <- err.Error()
			return
		}
		answer <- strings.TrimSpace(line)
	}()
	return conn
}

// result is kubescribe_admission_candidates_total{result} of reg.
func result(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "kubescribe_admission_candidates_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == name {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Issue 36, finding 1, the attacker's test: holding the route's admission token, mallory
// posts a candidate naming carol for the exact write she will make, holds the in-flight budget
// with four connections that announce the largest body and trickle it, and then the
// apiserver's real review of her write comes (as mallory, with the same credential). Before,
// the real review got 429 until the apiserver gave up, the write went through unreviewed
// (failurePolicy Ignore), and carol's forged candidate alone confirmed it. Now each holder is
// cut off once its body is late (408), one credential may hold only half the budget, and
// every review kubescribe could not take makes the route doubtful: the real review is served
// (two users match: unresolved) or lost (doubtful: unresolved). Never carol.
func TestSlowHoldersAndAForgedCandidateCreditNobody(t *testing.T) {
	s := startLossStack(t)
	require.Equal(t, http.StatusOK, s.post(t, updateReview(t, "carol")), "the forged candidate is taken: its poster holds the route's token")
	require.Eventually(t, func() bool {
		cs, err := s.store.Candidates(context.Background(), "local", "u1", "8")
		return err == nil && len(cs) == 1
	}, 5*time.Second, 10*time.Millisecond)

	answers := make(chan string, 4)
	for range 4 {
		s.holder(t, answers)
	}
	real := s.post(t, updateReview(t, "mallory")) // the apiserver's review of mallory's write
	require.Contains(t, []int{http.StatusOK, http.StatusTooManyRequests}, real)
	// Every holder is refused: cut off once its body is late (408, dropped_body), or refused
	// at once because the credential's share is held (429, dropped_busy; its connection is
	// then drained, holding no share, for up to a minute before the answer).
	require.Eventually(t, func() bool {
		cut, busy := result(t, s.reg, "dropped_body"), result(t, s.reg, "dropped_busy")
		return cut >= 1 && cut+busy >= 4
	}, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, <-answers, " 408 ", "the first answer is a holder cut off")

	out := make(chan AttributedChange, 1)
	s.joiner.Join(lossChange(t), func(a AttributedChange) { out <- a })
	a := await(t, out)
	require.NotEqual(t, "carol", a.Author.Username, "the forged candidate named the author")
	require.False(t, a.Author.Resolved)
	require.Equal(t, UnresolvedUsername, a.Author.Username)
}

// Without a loss, one user's candidate still names the author; a review refused (here: a body
// too slow) makes the route doubtful, on this replica and, through Redis, on another; and a
// change long after the loss is credited again.
func TestALostReviewMakesItsRouteDoubtfulOnEveryReplica(t *testing.T) {
	s := startLossStack(t)
	require.False(t, s.losses.Doubtful("local", time.Now()))
	require.Equal(t, http.StatusOK, s.post(t, updateReview(t, "bob")))
	require.Eventually(t, func() bool {
		cs, err := s.store.Candidates(context.Background(), "local", "u1", "8")
		return err == nil && len(cs) == 1
	}, 5*time.Second, 10*time.Millisecond)
	out := make(chan AttributedChange, 1)
	s.joiner.Join(lossChange(t), func(a AttributedChange) { out <- a })
	require.Equal(t, "bob", await(t, out).Author.Username)

	answer := make(chan string, 1)
	s.holder(t, answer)
	require.Contains(t, <-answer, " 408 ", "a body trickled past its time is cut off")
	lost := time.Now()
	require.True(t, s.losses.Doubtful("local", lost))
	require.False(t, s.losses.Doubtful("tenant-a", lost), "only the route of the lost review")
	other := admission.NewLosses(s.store) // another replica: it knows the loss from Redis only
	require.Eventually(t, func() bool { return other.Doubtful("local", lost) }, 5*time.Second, 10*time.Millisecond)
	require.False(t, other.Doubtful("local", lost.Add(admission.LossWindow+time.Second)))

	c := lossChange(t)
	c.ResourceVersion = "10"
	s.joiner.Join(c, func(a AttributedChange) { out <- a })
	a := await(t, out)
	require.False(t, a.Author.Resolved, "bob's candidate alone no longer names the author: his review may be the one lost")
}
