package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"

	"github.com/kubescribe/kubescribe/internal/testlog"
)

// TestKlogLoggerKeepsTheLogJSON: what client-go reports through klog (an error its reflector
// hands to utilruntime.HandleError, such as a watch RBAC refuses, and klog's own lines) arrives
// as JSON records of component client-go, errors at error level, rather than as plain lines on
// stderr. Messages below klog's verbosity stay out.
func TestKlogLoggerKeepsTheLogJSON(t *testing.T) {
	var out testlog.Buffer
	installKlogLogger(slog.New(slog.NewJSONHandler(&out, nil)))
	t.Cleanup(klog.ClearLogger)

	utilruntime.HandleError(errors.New(`namespaces is forbidden: User "edge" cannot watch resource "namespaces"`))
	klog.InfoS("Caches populated", "type", "*v1.Namespace")
	klog.V(4).InfoS("Starting reflector", "type", "*v1.Namespace") // below klog's verbosity: left out
	klog.Flush()

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, "%q", out.String())
	var recs []map[string]any
	for _, line := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a log line that is not JSON: %q", line)
		require.Equal(t, "client-go", rec["component"], line)
		recs = append(recs, rec)
	}
	require.Equal(t, "ERROR", recs[0]["level"])
	require.Contains(t, recs[0]["err"], "cannot watch resource")
	require.Equal(t, "INFO", recs[1]["level"])
	require.Equal(t, "Caches populated", recs[1]["msg"])
}
