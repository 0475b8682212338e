package manifestanalyzer

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

// golden compares v, as indented JSON, with testdata/name.golden (or rewrites it with -update).
// The golden files pin the JSON shape: a change to it shows as a diff in review.
func golden(t *testing.T, name string, v any) {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, WriteJSON(&buf, v))
	got := buf.Bytes()
	file := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(file, got, 0o644))
		return
	}
	want, err := os.ReadFile(file)
	require.NoError(t, err, "run go test ./pkg/manifestanalyzer/ -update to create it")
	require.Equal(t, string(want), string(got), "JSON shape or findings changed; if intended, rerun with -update and review the diff")
}

// Each folder under testdata/folders is named after the finding code it shows (or "adoptable").
func TestGoldenFolders(t *testing.T) {
	dirs, err := os.ReadDir(filepath.Join("testdata", "folders"))
	require.NoError(t, err)
	for _, d := range dirs {
		t.Run(d.Name(), func(t *testing.T) {
			r, err := ScanPath(context.Background(), filepath.Join("testdata", "folders", d.Name()), Options{})
			require.NoError(t, err)
			golden(t, "folder-"+d.Name(), r)
		})
	}
}

func TestGoldenRepo(t *testing.T) {
	r, err := ScanRepoPath(context.Background(), filepath.Join("testdata", "repo"), Options{})
	require.NoError(t, err)
	golden(t, "repo", r)
}
