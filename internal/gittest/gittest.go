// Package gittest runs the git CLI for tests that read what kubescribe pushed to a repository.
package gittest

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Run runs git with args in dir and returns its trimmed stdout, failing the test on error.
func Run(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := Output(dir, args...)
	require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
	return out
}

// Output runs git with args in dir and returns its trimmed stdout, or stdout and stderr with
// the error. Git never prompts for credentials.
func Output(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return strings.TrimSpace(string(out) + stderr.String()), err
	}
	return strings.TrimSpace(string(out)), nil
}
