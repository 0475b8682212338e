package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/declared"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// reviewAs is review() with the user's groups and extra replaced.
func reviewAs(t *testing.T, op, object, old string, groups []string, extra map[string][]string) string {
	t.Helper()
	var ar map[string]any
	require.NoError(t, json.Unmarshal([]byte(review(op, "", object, old, false)), &ar))
	ar["request"].(map[string]any)["userInfo"] = map[string]any{"username": "alice", "groups": groups, "extra": extra}
	b, err := json.Marshal(ar)
	require.NoError(t, err)
	return string(b)
}

// bigConfigMap is a ConfigMap of about n bytes of data, at resourceVersion rv.
func bigConfigMap(n int, rv, v string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":%q},"data":{"k":%q,"big":%q}}`,
		rv, v, strings.Repeat("x", n))
}

// A review is decoded, and its digest computed, before it is answered: what waits in the
// queue is the candidate alone (a few hundred bytes for a review of a megabyte), and an
// object that cannot be read is counted when it is answered, with nothing queued.
func TestReviewsAreParsedBeforeQueueing(t *testing.T) {
	f := newFixture(t, nil, false) // nothing drains: the queue shows what is kept
	f.allowed(t, review("UPDATE", "", bigConfigMap(1<<20, "7", "v2"), bigConfigMap(1<<20, "7", "v1"), false))
	require.Equal(t, 1.0, testutil.ToFloat64(f.metrics.queue))
	kept := testutil.ToFloat64(f.metrics.queueBytes)
	require.Positive(t, kept)
	require.Less(t, kept, 1024.0, "the queued candidate holds no object")
	c := <-f.h.queue
	require.Equal(t, digestOf(t, bigConfigMap(1<<20, "7", "v2")), c.Digest)
	require.Equal(t, "7", c.BaseResourceVersion)

	f.allowed(t, review("UPDATE", "", fmt.Sprintf(configMap, "7", "v1"), `{"metadata":"nope"}`, false))
	require.Equal(t, 1.0, f.result(resultInvalid), "counted before the answer")
	require.Empty(t, f.h.queue)
}

// The queue is bounded by bytes as well as by count: past QueueBytes a candidate is dropped
// and counted, and the write still allowed.
func TestQueueIsBoundedByBytes(t *testing.T) {
	groups := make([]string, 40)
	for i := range groups {
		groups[i] = "group-with-a-long-name-" + strconv.Itoa(i)
	}
	c, result, err := completeCandidate("local", decodeReview(t, reviewAs(t, "CREATE", fmt.Sprintf(configMap, "", "v1"), "", groups, nil)), declared.Manifest, nil)
	require.NoError(t, err)
	require.Empty(t, result)
	size := candidateSize(&c)
	f := newFixture(t, func(o *HandlerOptions) { o.QueueBytes = 3*size + size/2; o.QueueSize = 100 }, false)
	for range 5 {
		f.allowed(t, reviewAs(t, "CREATE", fmt.Sprintf(configMap, "", "v1"), "", groups, nil))
	}
	require.Equal(t, 3.0, testutil.ToFloat64(f.metrics.queue))
	require.Equal(t, float64(3*size), testutil.ToFloat64(f.metrics.queueBytes))
	require.Equal(t, 2.0, f.result(resultDroppedOverload))

	// Draining gives the bytes back.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.h.Run(ctx) }()
	require.Eventually(t, func() bool { return len(f.store.candidates()) == 3 }, 5*time.Second, 10*time.Millisecond)
	cancel()
	<-done
	require.Zero(t, testutil.ToFloat64(f.metrics.queueBytes))
	require.Zero(t, f.h.queued.Load())
}

// A userInfo past a cap (groups, extra keys, bytes) is refused as a candidate (it could not be
// recorded as the apiserver named it): the write is allowed, the refusal counted, nothing
// recorded. At the caps, a candidate is recorded.
func TestUserInfoIsCapped(t *testing.T) {
	f := newFixture(t, nil, true)
	create := fmt.Sprintf(configMap, "", "v1")
	many := func(n int, prefix string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = prefix + strconv.Itoa(i)
		}
		return out
	}
	extra := func(n int) map[string][]string {
		m := map[string][]string{}
		for i := range n {
			m["k"+strconv.Itoa(i)] = []string{"v"}
		}
		return m
	}
	f.allowed(t, reviewAs(t, "CREATE", create, "", many(MaxUserGroups+1, "g"), nil))
	f.allowed(t, reviewAs(t, "CREATE", create, "", nil, extra(MaxUserExtra+1)))
	f.allowed(t, reviewAs(t, "CREATE", create, "", []string{strings.Repeat("g", MaxUserBytes)}, nil))
	f.allowed(t, reviewAs(t, "CREATE", create, "", nil, map[string][]string{"k": many(200, strings.Repeat("v", 100))}))
	require.Equal(t, 4.0, f.result(resultUserTooLarge))

	f.allowed(t, reviewAs(t, "CREATE", create, "", many(MaxUserGroups, "g"), extra(MaxUserExtra)))
	require.Eventually(t, func() bool { return len(f.store.candidates()) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Len(t, f.store.candidates()[0].User.Groups, MaxUserGroups)
	require.Equal(t, 4.0, f.result(resultUserTooLarge))
}

// The bodies read and decoded at once are bounded: while one review holds the whole budget,
// another waits BodyWait, is refused 429 with Retry-After (the apiserver's client retries it)
// and is counted; once the first is answered, reviews are served again.
func TestInFlightBodiesAreBounded(t *testing.T) {
	const budget = 64 << 10
	f := newFixture(t, func(o *HandlerOptions) {
		o.MaxBodyBytes, o.InFlightBytes, o.BodyWait = budget, budget, 50*time.Millisecond
		o.BodyGrace = time.Hour // the slow body below is not cut off (TestSlowBodyIsCutOff)
	}, true)
	body := review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false)

	// A review of unknown length may be as large as the limit: it takes the whole budget
	// and holds it while its body trickles in.
	pr, pw := io.Pipe()
	slow, err := http.NewRequest(http.MethodPost, f.srv.URL+PathPrefix+"local", pr)
	require.NoError(t, err)
	slow.Header.Set("Content-Type", "application/json")
	answered := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(slow)
		if err != nil {
			answered <- 0
			return
		}
		_ = resp.Body.Close()
		answered <- resp.StatusCode
	}()
	_, err = pw.Write([]byte(body[:10]))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testutil.ToFloat64(f.metrics.inFlight) == budget }, 5*time.Second, 5*time.Millisecond)

	resp, err := http.Post(f.srv.URL+PathPrefix+"local", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	msg, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, string(msg))
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Contains(t, string(msg), "too many review bytes in flight")
	require.Equal(t, 1.0, f.result(resultDroppedBusy))

	_, err = pw.Write([]byte(body[10:]))
	require.NoError(t, err)
	require.NoError(t, pw.Close())
	require.Equal(t, http.StatusOK, <-answered)
	require.Zero(t, testutil.ToFloat64(f.metrics.inFlight))
	f.allowed(t, body)
	require.Eventually(t, func() bool { return len(f.store.candidates()) == 2 }, 5*time.Second, 10*time.Millisecond)
}

// A review refused 429 has its body read (and dropped) first: the connection stays open for
// the client's retry, instead of being closed with most of a large body unread, which a client
// still sending sees as a reset rather than the 429.
func TestRefusedReviewKeepsTheConnection(t *testing.T) {
	const budget = 1 << 20
	f := newFixture(t, func(o *HandlerOptions) {
		o.MaxBodyBytes, o.InFlightBytes, o.BodyWait = budget, budget, 200*time.Millisecond
		o.BodyGrace = time.Hour // the slow body below keeps the budget (TestSlowBodyIsCutOff)
	}, true)
	pr, pw := io.Pipe()
	defer pw.Close()
	slow, err := http.NewRequest(http.MethodPost, f.srv.URL+PathPrefix+"local", pr)
	require.NoError(t, err)
	go func() {
		if resp, err := http.DefaultClient.Do(slow); err == nil {
			_ = resp.Body.Close()
		}
	}()
	_, err = pw.Write([]byte("{"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return testutil.ToFloat64(f.metrics.inFlight) == budget }, 5*time.Second, 5*time.Millisecond)

	c := &http.Client{Transport: &http.Transport{}}
	post := func(body string) (status int, reused bool) {
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+PathPrefix+"local", strings.NewReader(body))
		require.NoError(t, err)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, reused
	}
	large := `{"pad":"` + strings.Repeat("x", 600<<10) + `"}`
	status, _ := post(large)
	require.Equal(t, http.StatusTooManyRequests, status)
	status, reused := post(large)
	require.Equal(t, http.StatusTooManyRequests, status)
	require.True(t, reused, "the connection of the refused review was closed")
}

func TestHandlerBudgetMustHoldTheLargestReview(t *testing.T) {
	_, err := NewHandler(HandlerOptions{Store: newFakeStore(), Render: declared.Manifest, MaxBodyBytes: 1 << 20, InFlightBytes: 1 << 19})
	require.ErrorContains(t, err, "must hold one review of the largest size")
	h, err := NewHandler(HandlerOptions{Store: newFakeStore(), Render: declared.Manifest, MaxBodyBytes: 64 << 20})
	require.NoError(t, err)
	require.EqualValues(t, 64<<20, h.opts.InFlightBytes, "the default budget grows to the largest review")
}

// slowReview starts a review of unknown length (its share is the whole limit) that sends "{"
// and then nothing, with the bearer token given ("" for none); the returned channel gets its
// status (0 when the connection failed).
func slowReview(t *testing.T, f *fixture, bearer string) chan int {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+PathPrefix+"local", pr)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	answered := make(chan int, 1)
	go func() {
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err != nil {
			answered <- 0
			return
		}
		_ = resp.Body.Close()
		answered <- resp.StatusCode
	}()
	_, err = pw.Write([]byte("{"))
	require.NoError(t, err)
	return answered
}

// Issue 36, finding 1: a caller that holds its share of the in-flight budget by trickling its
// body is cut off once its body is late (the grace, plus its share at the minimum rate), with
// 408; its share is given back, and its route is doubtful.
func TestSlowBodyIsCutOff(t *testing.T) {
	losses := NewLosses(nil)
	f := newFixture(t, func(o *HandlerOptions) {
		o.MaxBodyBytes, o.InFlightBytes = 64<<10, 64<<10
		o.BodyGrace, o.BodyMinRate = 100*time.Millisecond, 1<<20
		o.Losses = losses
	}, true)
	answered := slowReview(t, f, "")
	status := <-answered
	require.True(t, status == http.StatusRequestTimeout || status == 0, "status %d", status)
	require.Equal(t, 1.0, f.result(resultDroppedBody))
	require.Zero(t, testutil.ToFloat64(f.metrics.inFlight), "the share is given back")
	require.True(t, losses.Doubtful("local", time.Now()), "the route is doubtful")
	require.False(t, losses.Doubtful("other", time.Now()))
	f.allowed(t, review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false))
}

// Issue 36, finding 1: one credential holds at most its share of the budget (half of it by
// default): another credential's reviews still find room, while the holder's next one is
// refused (429) and makes the route doubtful.
func TestOneCredentialCannotHoldTheWholeBudget(t *testing.T) {
	losses := NewLosses(nil)
	auth := &reviewhttp.Auth{Callers: audit.Authenticator{LocalRoute: "local", Tokens: []audit.Token{
		{Value: []byte("secret-a"), Routes: []string{"local"}, Line: 1},
		{Value: []byte("secret-b"), Routes: []string{"local"}, Line: 2},
	}}}
	f := newFixture(t, func(o *HandlerOptions) {
		o.MaxBodyBytes, o.InFlightBytes, o.BodyWait = 64<<10, 128<<10, 50*time.Millisecond
		o.BodyGrace = time.Hour
		o.Auth, o.Losses = auth, losses
	}, true)
	require.EqualValues(t, 64<<10, f.h.opts.CallerInFlightBytes)
	slowReview(t, f, "secret-a")
	require.Eventually(t, func() bool { return testutil.ToFloat64(f.metrics.inFlight) == 64<<10 }, 5*time.Second, 5*time.Millisecond)
	require.False(t, losses.Doubtful("local", time.Now()))

	body := review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false)
	post := func(secret string) int {
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+PathPrefix+"local", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, post("secret-b"), "another credential finds room")
	require.Equal(t, http.StatusTooManyRequests, post("secret-a"), "the holder's credential has its share spent")
	require.True(t, losses.Doubtful("local", time.Now()))

	_, err := NewHandler(HandlerOptions{Store: newFakeStore(), Render: declared.Manifest, MaxBodyBytes: 1 << 20, InFlightBytes: 4 << 20, CallerInFlightBytes: 1 << 19})
	require.ErrorContains(t, err, "must hold one review of the largest size")
}

// Every review kubescribe could not turn into a stored candidate makes its route doubtful: an
// undecodable one, an invalid object, a full queue, a store failure. A dry run and a request no
// candidate describes do not.
func TestWhatMakesARouteDoubtful(t *testing.T) {
	cm := review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false)
	for name, tc := range map[string]struct {
		review              string
		queueBytes          int64
		failStore, doubtful bool
	}{
		"recorded":      {review: cm},
		"dry run":       {review: review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", true)},
		"connect":       {review: review("CONNECT", "", "", "", false)},
		"invalid":       {review: review("CREATE", "", `{"metadata":"nope"}`, "", false), doubtful: true},
		"undecodable":   {review: `{"apiVersion":"admission.k8s.io/v1"`, doubtful: true},
		"queue full":    {review: cm, queueBytes: 1, doubtful: true},
		"store failure": {review: cm, failStore: true, doubtful: true},
	} {
		t.Run(name, func(t *testing.T) {
			losses := NewLosses(nil)
			f := newFixture(t, func(o *HandlerOptions) { o.Losses, o.QueueBytes = losses, tc.queueBytes }, false)
			if tc.failStore {
				f.store.err = errors.New("redis down")
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); f.h.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			_, _ = f.post(t, "local", tc.review)
			if name == "recorded" || tc.failStore {
				<-f.store.stored // the batch was tried
			}
			if tc.doubtful {
				require.Eventually(t, func() bool { return losses.Doubtful("local", time.Now()) }, 5*time.Second, 5*time.Millisecond)
				return
			}
			require.False(t, losses.Doubtful("local", time.Now()))
		})
	}
}
