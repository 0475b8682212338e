package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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

// The ops endpoints answer as docs/operations.md says, with the documented series, after the
// other tests drove audit batches, joins and pushes through kubescribe.
func TestOpsEndpoints(t *testing.T) {
	code, _ := get(t, "/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, body)

	code, body = get(t, "/metrics")
	require.Equal(t, http.StatusOK, code)
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
