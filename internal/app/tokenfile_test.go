package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/testlog"
)

// TestFollowTokenFile: the audit token file is read again while kubescribe runs; a change is
// logged with the number of tokens, one that does not load with its line, never a token.
func TestFollowTokenFile(t *testing.T) {
	defer func(d time.Duration) { tokenFileCheckInterval = d }(tokenFileCheckInterval)
	tokenFileCheckInterval = 10 * time.Millisecond
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte("first-secret\n"), 0o600))
	f, err := audit.OpenTokenFile("audit token file", path, "local")
	require.NoError(t, err)
	var out testlog.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); followTokenFile(ctx, f, slog.New(slog.NewJSONHandler(&out, nil))) }()
	defer func() { cancel(); <-done }()

	writeFile(t, path, []byte("second-secret\nthird-secret tenant-a\n"))
	require.Eventually(t, func() bool { return strings.Contains(out.String(), `"msg":"token file reloaded"`) }, 10*time.Second, 5*time.Millisecond)
	require.Contains(t, out.String(), `"tokens":2`)
	a := audit.Authenticator{LocalRoute: "local", TokenFile: f}
	_, ok := a.AuthenticateToken([]byte("second-secret"))
	require.True(t, ok)

	writeFile(t, path, []byte("fourth-secret Bad_Route\n"))
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "does not load") }, 10*time.Second, 5*time.Millisecond)
	require.Contains(t, out.String(), "line 1")
	_, ok = a.AuthenticateToken([]byte("second-secret"))
	require.True(t, ok, "the previous tokens stay in force")
	require.NotContains(t, out.String(), "secret", "no token is logged")
}
