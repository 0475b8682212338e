package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubescribe/kubescribe/test/deploy"
)

// The Prometheus Operator's CRDs, for the dry run of deploy/components/monitoring: the
// example/prometheus-operator-crd folder of the github.com/prometheus-operator/prometheus-operator
// Go module (the CRDs its bundle.yaml installs), taken through the Go module proxy, its hash
// pinned. Only the kinds the component uses are installed.
const (
	prometheusOperatorModule  = "github.com/prometheus-operator/prometheus-operator"
	prometheusOperatorVersion = "v0.85.0"
	prometheusOperatorSum     = "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
)

var prometheusOperatorCRDs = []string{"monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"}

// TestMonitoringComponentDryRun: deploy/components/monitoring, added to each overlay and in the
// overlays docs/install.md shows, is accepted by a real kube-apiserver serving the Prometheus
// Operator's CRDs (and cert-manager's), which validate the ServiceMonitor and the
// PrometheusRule against their schemas (server-side dry run, as TestDeployOverlaysDryRun does
// for the overlays).
func TestMonitoringComponentDryRun(t *testing.T) {
	crdClient, err := apiextensionsclient.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	// The cert-manager overlay needs cert-manager's CRDs too.
	installCRDs(t, crdClient, readPrometheusOperatorCRDs(t))
	installCertManagerCRDs(t, crdClient)

	builds := map[string]func(t *testing.T) ([]*unstructured.Unstructured, error){}
	for _, overlay := range deploy.Overlays {
		builds[overlay] = func(t *testing.T) ([]*unstructured.Unstructured, error) {
			kustomization, err := deploy.WithComponent(repoRoot(t), overlay, "monitoring")
			if err != nil {
				return nil, err
			}
			return deploy.BuildOverlay(repoRoot(t), t.TempDir(), overlay+"-monitoring", kustomization)
		}
	}
	docs, err := deploy.MonitoringDocOverlays(repoRoot(t))
	require.NoError(t, err)
	for name, kustomization := range docs {
		builds["docs/"+name] = func(t *testing.T) ([]*unstructured.Unstructured, error) {
			return deploy.BuildOverlay(repoRoot(t), t.TempDir(), name, kustomization)
		}
	}
	for name, build := range builds {
		t.Run(name, func(t *testing.T) {
			objs, err := build(t)
			require.NoError(t, err)
			require.NotNil(t, deploy.Find(objs, "ServiceMonitor", "kubescribe"))
			require.NotNil(t, deploy.Find(objs, "PrometheusRule", "kubescribe"))
			dryRunBuild(t, crdClient, objs)
		})
	}
}

// readPrometheusOperatorCRDs downloads (or finds in the module cache) the Prometheus Operator's
// module and returns the CRDs the component needs as one YAML stream.
func readPrometheusOperatorCRDs(t *testing.T) []byte {
	t.Helper()
	dir := downloadModule(t, prometheusOperatorModule, prometheusOperatorVersion, prometheusOperatorSum)
	var files []string
	for _, f := range prometheusOperatorCRDs {
		files = append(files, filepath.Join(dir, "example", "prometheus-operator-crd", f))
	}
	return concatYAML(t, files)
}

// downloadModule downloads (or finds in the module cache) a Go module with `go mod download`,
// checks that it is the one of hash sum, and returns its folder.
func downloadModule(t *testing.T, module, version, sum string) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goCmd, "mod", "download", "-json", module+"@"+version)
	cmd.Dir = t.TempDir() // outside the main module: its go.mod stays as it is
	out, err := cmd.Output()
	require.NoError(t, err, "go mod download %s@%s: %s", module, version, out)
	var mod struct{ Dir, Sum string }
	require.NoError(t, json.Unmarshal(out, &mod))
	require.Equal(t, sum, mod.Sum, "%s@%s is not the module this test was written against", module, version)
	return mod.Dir
}

// concatYAML reads files into one YAML stream.
func concatYAML(t *testing.T, files []string) []byte {
	t.Helper()
	var all bytes.Buffer
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		all.WriteString("\n---\n")
		all.Write(b)
	}
	return all.Bytes()
}
