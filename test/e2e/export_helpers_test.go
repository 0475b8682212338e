package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubescribe/kubescribe/test/stack"
)

// Binaries built from this repository for the tests that run them as a user does: the CLI,
// and the server for a test that kills it.
var (
	buildMu  sync.Mutex
	built    = map[string]string{} // package -> binary
	buildErr = map[string]error{}
)

// binary builds the main package pkg ("./cmd/kubescribe") once per package run, inside the
// stack's folder, which is removed with it after a passing run.
func binary(t *testing.T, pkg, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if _, done := built[pkg]; !done {
		path := filepath.Join(env.Dir, "bin", name)
		root, err := stack.RepoRoot()
		if err == nil {
			cmd := exec.Command("go", "build", "-o", path, pkg)
			cmd.Dir = root
			if out, cerr := cmd.CombinedOutput(); cerr != nil {
				err = fmt.Errorf("go build %s: %w: %s", pkg, cerr, out)
			}
		}
		built[pkg], buildErr[pkg] = path, err
	}
	require.NoError(t, buildErr[pkg], "building %s", pkg)
	return built[pkg]
}

// kubescribeCLI builds cmd/kubescribe once per package run.
func kubescribeCLI(t *testing.T) string { return binary(t, "./cmd/kubescribe", "kubescribe") }

// kubeconfigFor writes a kubeconfig file for a user of the control plane, context "e2e".
func kubeconfigFor(t *testing.T, user string) string {
	t.Helper()
	cfg := configFor(user)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	kc.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// cliResult is one run of the CLI.
type cliResult struct {
	code           int
	stdout, stderr string
	maxRSSKiB      int64
}

// runCLI runs the kubescribe CLI with args and returns its exit code and output.
func runCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(kubescribeCLI(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		require.NoError(t, err)
	}
	r := cliResult{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errOut.String()}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSSKiB = ru.Maxrss
	}
	return r
}
