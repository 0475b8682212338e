package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

var fixtures = filepath.Join("..", "..", "pkg", "manifestanalyzer", "testdata")

func scan(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"scan"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestScanExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		out  string
		err  string
	}{
		{name: "adoptable", args: []string{filepath.Join(fixtures, "folders", "adoptable")}, code: 0, out: "adoptable (6 objects in 7 files, 0 errors, 1 warning)"},
		{name: "not adoptable", args: []string{filepath.Join(fixtures, "folders", "plaintext-secret")}, code: 1, out: "NOT adoptable"},
		{name: "flags after the folder", args: []string{filepath.Join(fixtures, "folders", "adoptable"), "--format", "json"}, code: 0, out: `"adoptable": true`},
		{name: "repo with an adoptable folder", args: []string{"--repo", filepath.Join(fixtures, "repo")}, code: 0, out: "1 adoptable: clusters/prod"},
		{name: "repo without one", args: []string{"--repo", filepath.Join(fixtures, "folders", "plaintext-secret")}, code: 1, out: "0 adoptable"},
		{name: "missing folder", args: []string{filepath.Join(t.TempDir(), "missing")}, code: 2, err: "no such file or directory"},
		{name: "no folder", args: nil, code: 2, err: "want exactly one folder"},
		{name: "two folders", args: []string{"a", "b"}, code: 2, err: "want exactly one folder"},
		{name: "bad format", args: []string{"--format", "xml", "."}, code: 2, err: `--format "xml": want text, json or yaml`},
		{name: "unknown flag", args: []string{"--nope", "."}, code: 2, err: "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := scan(t, tt.args...)
			require.Equal(t, tt.code, code, "stdout %s\nstderr %s", out, errOut)
			require.Contains(t, out, tt.out)
			require.Contains(t, errOut, tt.err)
		})
	}
}

// --format json prints exactly the package's Report; --format yaml the same fields.
func TestScanFormats(t *testing.T) {
	dir := filepath.Join(fixtures, "folders", "duplicate-object")
	want, err := manifestanalyzer.ScanPath(context.Background(), dir, manifestanalyzer.Options{})
	require.NoError(t, err)
	var wantJSON bytes.Buffer
	require.NoError(t, manifestanalyzer.WriteJSON(&wantJSON, want))

	code, out, _ := scan(t, "--format", "json", dir)
	require.Equal(t, 1, code)
	require.Equal(t, wantJSON.String(), out)
	dec := json.NewDecoder(bytes.NewReader([]byte(out)))
	dec.DisallowUnknownFields()
	var got manifestanalyzer.Report
	require.NoError(t, dec.Decode(&got))
	require.Equal(t, *want, got)

	code, out, _ = scan(t, "--format", "yaml", dir)
	require.Equal(t, 1, code)
	var fromYAML manifestanalyzer.Report
	require.NoError(t, yaml.UnmarshalStrict([]byte(out), &fromYAML))
	require.Equal(t, *want, fromYAML)

	code, out, _ = scan(t, "--repo", "--format", "json", filepath.Join(fixtures, "repo"))
	require.Equal(t, 0, code)
	var repo manifestanalyzer.RepoReport
	require.NoError(t, json.Unmarshal([]byte(out), &repo))
	require.Equal(t, manifestanalyzer.SchemaVersion, repo.SchemaVersion)
	require.Equal(t, []string{"clusters/prod"}, repo.Adoptable())
}
