package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/test/deploy"
	"github.com/kubescribe/kubescribe/test/stack"
)

// cert-manager's CRDs, for the dry run of the cert-manager overlay: the deploy/crds folder of
// the github.com/cert-manager/cert-manager Go module (which its README keeps "for reference,
// development and testing purposes"), taken through the Go module proxy, its hash pinned.
const (
	certManagerModule  = "github.com/cert-manager/cert-manager"
	certManagerVersion = "v1.21.2"
	certManagerSum     = "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68="
)

// TestDeployOverlaysDryRun: every overlay of deploy/ and of docs/install.md, as `kubectl apply
// -k` would send it, is accepted by a real kube-apiserver: the Namespaces and CRDs of the build
// are created for real first (custom objects are validated against their CRD's schema, and
// namespaced objects need their namespace), cert-manager's CRDs too, then every other object is
// created (or, where it exists, replaced) with dryRun=All: validation, defaulting and admission
// run and nothing is stored.
func TestDeployOverlaysDryRun(t *testing.T) {
	crdClient, err := apiextensionsclient.NewForConfig(env.AdminConfig)
	require.NoError(t, err)

	installCertManagerCRDs(t, crdClient)

	installs, err := deploy.Installations(repoRoot(t))
	require.NoError(t, err)
	for overlay, kustomization := range installs {
		t.Run(overlay, func(t *testing.T) {
			objs, err := deploy.BuildOverlay(repoRoot(t), t.TempDir(), overlay, kustomization)
			require.NoError(t, err)
			dryRunBuild(t, crdClient, objs)
		})
	}
}

// installCRDs creates the CRDs of a YAML stream, waits until they are served, and deletes them
// when the test ends: the other tests' discovery need not see them. cert-manager's CRDs, which
// two tests need, go through installCertManagerCRDs instead.
func installCRDs(t *testing.T, crdClient apiextensionsclient.Interface, crdYAML []byte) {
	t.Helper()
	require.NoError(t, stack.Apply(context.Background(), env.AdminConfig, crdYAML))
	crds, err := deploy.Objects(crdYAML)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, crd := range crds {
			err := crdClient.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.GetName(), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", crd.GetName(), err)
			}
		}
	})
	waitEstablished(t, crdClient, crds)
}

// dryRunBuild sends a build to the apiserver: its Namespaces and CRDs for real, everything
// else with dryRun=All.
func dryRunBuild(t *testing.T, crdClient apiextensionsclient.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	var first, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition" {
			first = append(first, o)
		} else {
			rest = append(rest, o)
		}
	}
	require.NoError(t, stack.Apply(context.Background(), env.AdminConfig, stream(t, first)))
	waitEstablished(t, crdClient, first)
	require.NoError(t, stack.DryRun(context.Background(), env.AdminConfig, stream(t, rest)))
}

// certManagerOnce installs cert-manager's CRDs once per package run, kept until the control
// plane goes: deleted by one test and installed again by the next, a CRD was found still
// terminating (its deletion finishes in the background, and in the full run took more than a
// minute), left as it was by the apply, and never became Established.
var certManagerOnce sync.Once

func installCertManagerCRDs(t *testing.T, crdClient apiextensionsclient.Interface) {
	t.Helper()
	crdYAML := readCertManagerCRDs(t)
	certManagerOnce.Do(func() { require.NoError(t, stack.Apply(context.Background(), env.AdminConfig, crdYAML)) })
	crds, err := deploy.Objects(crdYAML)
	require.NoError(t, err)
	waitEstablished(t, crdClient, crds)
}

// readCertManagerCRDs downloads (or finds in the module cache) cert-manager's module and
// returns its CRDs as one YAML stream.
func readCertManagerCRDs(t *testing.T) []byte {
	t.Helper()
	dir := downloadModule(t, certManagerModule, certManagerVersion, certManagerSum)
	files, err := filepath.Glob(filepath.Join(dir, "deploy", "crds", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return concatYAML(t, files)
}

// waitEstablished waits until each CRD among objs is Established (served).
func waitEstablished(t *testing.T, client apiextensionsclient.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		require.True(t, poll(time.Minute, func() bool {
			crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), o.GetName(), metav1.GetOptions{})
			return err == nil && slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			})
		}), "CRD %s not established", o.GetName())
	}
}

func stream(t *testing.T, objs []*unstructured.Unstructured) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		require.NoError(t, err)
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes()
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := stack.RepoRoot()
	require.NoError(t, err)
	return root
}
