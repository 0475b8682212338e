package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(env.OpsURL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// metricsPage is kubescribe's /metrics, read with the stack's metrics reader token.
func metricsPage(t *testing.T) string {
	t.Helper()
	code, b, err := env.GetMetrics(env.MetricsToken)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", b)
	return string(b)
}

// The ops and metrics endpoints answer as docs/operations.md says, with the documented series,
// after the other tests drove audit batches, joins and pushes through kubescribe.
func TestOpsEndpoints(t *testing.T) {
	code, _ := get(t, "/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, body)

	body = metricsPage(t)
	for _, series := range []string{
		`kubescribe_audit_requests_total{code="200"}`,
		`kubescribe_audit_events_total{result="kept"}`,
		`kubescribe_audit_batch_bytes_count`,
		`kubescribe_attribution_joins_total{result="resolved"}`,
		`kubescribe_attribution_join_wait_seconds_count{result="resolved"}`,
		`kubescribe_attribution_pending_changes`,
		`kubescribe_git_commits_total`,
		`kubescribe_git_push_total{result="success"}`,
		`kubescribe_git_pending_changes`,
		`go_goroutines`,
	} {
		require.True(t, hasSeries(body, series), "series %s missing from /metrics", series)
	}
}

// hasSeries reports whether the exposition has a sample of series (name with its exact labels).
func hasSeries(exposition, series string) bool {
	for _, line := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(line, series+" ") {
			return true
		}
	}
	return false
}

// metricValue is the value of one series of kubescribe's /metrics: 0 when absent, or when
// kubescribe does not answer (it may be restarting; callers poll).
func metricValue(t *testing.T, series string) float64 {
	t.Helper()
	m, err := env.ScrapeMetrics()
	if err != nil {
		return 0
	}
	return m[series]
}

// The watch and Redis metrics move with traffic: a ConfigMap created in a mirrored namespace is
// an event of its resource, its join reads Redis, and an informer runs for it.
func TestWatchAndRedisMetricsMove(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-metrics", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	created := `kubescribe_watch_events_total{cluster="local",resource="configmaps",type="create"}`
	redisOK := `kubescribe_redis_requests_total{kind="command",result="ok"}`
	events, redisCalls := metricValue(t, created), metricValue(t, redisOK)
	require.GreaterOrEqual(t, metricValue(t, `kubescribe_watch_informers{cluster="local"}`), 1.0)

	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "counted"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 1)
	require.Greater(t, metricValue(t, created), events)
	require.Greater(t, metricValue(t, redisOK), redisCalls)
	require.True(t, hasSeries(metricsPage(t), "kubescribe_controller_queue_depth"))
}
