// Package deploy builds the kustomizations of the repository's deploy/ folder for the tests, as
// `kubectl apply -k` builds them: with kustomize's own library (krusty), from the files on
// disk, resources in kustomize's legacy order (Namespaces and CRDs first, webhook
// configurations last). The overlays read credentials from files deploy/secrets.sh writes and
// Git ignores, so the tests build a copy of deploy/ in which the script has run.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Overlays are the folders under deploy/overlays, each a complete installation.
var Overlays = []string{"quickstart", "cert-manager", "managed"}

// Copy copies the repository's deploy/ folder (root is the repository) into dir, without any
// secrets/ folder a user's run of deploy/secrets.sh left there, and returns the copy's path.
func Copy(root, dir string) (string, error) {
	src := filepath.Join(root, "deploy")
	dst := filepath.Join(dir, "deploy")
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "secrets" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, info.Mode().Perm())
	})
	return dst, err
}

// MakeSecrets runs deploy/secrets.sh (of the copy deployDir) for the kustomization in dir.
func MakeSecrets(deployDir, dir string, env ...string) error {
	cmd := exec.Command("bash", filepath.Join(deployDir, "secrets.sh"), dir)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("deploy/secrets.sh %s: %w\n%s", dir, err, out)
	}
	return nil
}

// Build builds the kustomization in dir and returns its YAML stream.
func Build(dir string) ([]byte, error) {
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

// Objects decodes a YAML stream into its objects, in order (numbers as int64, as the API
// machinery decodes them).
func Objects(stream []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw); err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
}

// BuildOverlay copies root's deploy/ into dir, makes the secrets/ files of the overlay named
// (a folder under deploy/overlays) with deploy/secrets.sh, and builds it. With kustomization
// set, the overlay is that kustomization.yaml, written into deploy/overlays/<name> of the copy
// first (an overlay of DocOverlays); the secrets/ files of the overlays of deploy/overlays its
// resources build on (`../quickstart`) are made first, as the user made them when installing
// that overlay.
func BuildOverlay(root, dir, name string, kustomization []byte, env ...string) ([]*unstructured.Unstructured, error) {
	deployDir, err := Copy(root, dir)
	if err != nil {
		return nil, err
	}
	overlay := filepath.Join(deployDir, "overlays", name)
	if kustomization != nil {
		bases, err := baseOverlays(kustomization)
		if err != nil {
			return nil, fmt.Errorf("overlay %s: %w", name, err)
		}
		for _, base := range bases {
			if err := MakeSecrets(deployDir, filepath.Join(deployDir, "overlays", base), env...); err != nil {
				return nil, err
			}
		}
		if err := os.MkdirAll(overlay, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), kustomization, 0o644); err != nil {
			return nil, err
		}
	}
	return BuildIn(deployDir, overlay, env...)
}

// baseOverlays are the overlays of deploy/overlays (Overlays) a kustomization next to them
// names among its resources (`../quickstart`).
func baseOverlays(kustomization []byte) ([]string, error) {
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(kustomization, &k); err != nil {
		return nil, err
	}
	var bases []string
	for _, r := range k.Resources {
		if base, ok := strings.CutPrefix(r, "../"); ok && slices.Contains(Overlays, base) {
			bases = append(bases, base)
		}
	}
	return bases, nil
}

// docOverlay marks, in docs/install.md, the YAML block that follows as an overlay the tests
// build: "<!-- test/deploy overlay NAME -->".
var docOverlay = regexp.MustCompile("(?m)^<!-- test/deploy overlay ([a-z0-9-]+) -->\n```yaml\n((?s:.*?))```$")

// DocOverlays are the example overlays of docs/install.md, by name: kustomizations to be
// written next to deploy/overlays/*.
func DocOverlays(root string) (map[string][]byte, error) {
	return docBlocks(root, docOverlay, "overlay")
}

// docBlocks are the YAML blocks of docs/install.md that marker marks, by name.
func docBlocks(root string, marker *regexp.Regexp, what string) (map[string][]byte, error) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "install.md"))
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, m := range marker.FindAllSubmatch(doc, -1) {
		out[string(m[1])] = m[2]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("docs/install.md marks no %s", what)
	}
	return out, nil
}

// Installations are every overlay of deploy/overlays (with a nil kustomization) and of
// DocOverlays, by name, for BuildOverlay.
func Installations(root string) (map[string][]byte, error) {
	all, err := DocOverlays(root)
	if err != nil {
		return nil, err
	}
	for _, o := range Overlays {
		if _, ok := all[o]; ok {
			return nil, fmt.Errorf("docs/install.md names an overlay %s, as deploy/overlays does", o)
		}
		all[o] = nil
	}
	return all, nil
}

// BuildIn makes the secrets/ files of the kustomization in dir with deployDir's
// deploy/secrets.sh, and builds it.
func BuildIn(deployDir, dir string, env ...string) ([]*unstructured.Unstructured, error) {
	if err := MakeSecrets(deployDir, dir, env...); err != nil {
		return nil, err
	}
	stream, err := Build(dir)
	if err != nil {
		return nil, err
	}
	return Objects(stream)
}

// Find returns the object of kind and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Container returns the container of a workload's Pod template, as the typed API reads it,
// and the Pod template's volumes.
func Container(workload *unstructured.Unstructured, name string) (*corev1.Container, []corev1.Volume, error) {
	var spec corev1.PodSpec
	m, found, err := unstructured.NestedMap(workload.Object, "spec", "template", "spec")
	if err != nil || !found {
		return nil, nil, fmt.Errorf("%s %s has no Pod template: %v", workload.GetKind(), workload.GetName(), err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &spec); err != nil {
		return nil, nil, err
	}
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i], spec.Volumes, nil
		}
	}
	return nil, nil, fmt.Errorf("%s %s has no container %q", workload.GetKind(), workload.GetName(), name)
}

// IssuedByCertManager is the content PodFiles gives the keys of a Secret that a cert-manager
// Certificate of the build issues (tls.crt, tls.key, ca.crt).
const IssuedByCertManager = "issued by cert-manager"

// PodFiles is what a container of workload finds in its mounted Secret and ConfigMap volumes,
// by path, as the kubelet would project it from the built objects: a Secret or ConfigMap the
// build generates, or a Secret a Certificate of the build names (its keys then hold
// IssuedByCertManager). It fails when a volume names one that neither provides, or an item
// names a key the source lacks: the Pod would not start.
func PodFiles(objs []*unstructured.Unstructured, workload *unstructured.Unstructured, container string) (map[string][]byte, error) {
	c, volumes, err := Container(workload, container)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for _, mount := range c.VolumeMounts {
		i := slices.IndexFunc(volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
		if i < 0 {
			if slices.Contains(claimTemplates(workload), mount.Name) {
				continue // a StatefulSet's PersistentVolumeClaim
			}
			return nil, fmt.Errorf("volumeMount %s names no volume", mount.Name)
		}
		v := volumes[i]
		var data map[string][]byte
		var items []corev1.KeyToPath
		switch {
		case v.Secret != nil:
			items = v.Secret.Items
			if data, err = secretData(objs, v.Secret.SecretName); err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
		case v.ConfigMap != nil:
			items = v.ConfigMap.Items
			cm := Find(objs, "ConfigMap", v.ConfigMap.Name)
			if cm == nil {
				return nil, fmt.Errorf("volume %s: ConfigMap %s is not in the build", v.Name, v.ConfigMap.Name)
			}
			strs, _, _ := unstructured.NestedStringMap(cm.Object, "data")
			data = map[string][]byte{}
			for k, s := range strs {
				data[k] = []byte(s)
			}
		default:
			continue // emptyDir and the like: nothing read from the build
		}
		if items == nil {
			for k, b := range data {
				files[path.Join(mount.MountPath, k)] = b
			}
			continue
		}
		for _, it := range items {
			b, ok := data[it.Key]
			if !ok {
				return nil, fmt.Errorf("volume %s: no key %s", v.Name, it.Key)
			}
			files[path.Join(mount.MountPath, it.Path)] = b
		}
	}
	return files, nil
}

// claimTemplates are the names of a StatefulSet's volumeClaimTemplates.
func claimTemplates(workload *unstructured.Unstructured) []string {
	var names []string
	templates, _, _ := unstructured.NestedSlice(workload.Object, "spec", "volumeClaimTemplates")
	for _, c := range templates {
		if name, _, _ := unstructured.NestedString(c.(map[string]any), "metadata", "name"); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// secretData is the data of the Secret name of the build, or the keys a cert-manager
// Certificate of the build writes into it.
func secretData(objs []*unstructured.Unstructured, name string) (map[string][]byte, error) {
	if s := Find(objs, "Secret", name); s != nil {
		var secret corev1.Secret
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(s.Object, &secret); err != nil {
			return nil, err
		}
		data := map[string][]byte{}
		maps.Copy(data, secret.Data)
		for k, v := range secret.StringData {
			data[k] = []byte(v)
		}
		return data, nil
	}
	for _, o := range objs {
		if o.GetKind() != "Certificate" {
			continue
		}
		if n, _, _ := unstructured.NestedString(o.Object, "spec", "secretName"); n == name {
			return map[string][]byte{"tls.crt": []byte(IssuedByCertManager), "tls.key": []byte(IssuedByCertManager),
				"ca.crt": []byte(IssuedByCertManager)}, nil
		}
	}
	return nil, fmt.Errorf("the Secret %s is neither in the build nor issued by a Certificate of it", name)
}

// EnvFrom resolves the value of a container's environment variable set from a ConfigMap of
// the build (configMapKeyRef).
func EnvFrom(objs []*unstructured.Unstructured, c *corev1.Container, name string) (string, error) {
	for _, e := range c.Env {
		if e.Name != name || e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		cm := Find(objs, "ConfigMap", ref.Name)
		if cm == nil {
			return "", fmt.Errorf("env %s: ConfigMap %s is not in the build", name, ref.Name)
		}
		v, found, _ := unstructured.NestedString(cm.Object, "data", ref.Key)
		if !found {
			return "", fmt.Errorf("env %s: ConfigMap %s has no key %s", name, ref.Name, ref.Key)
		}
		return v, nil
	}
	return "", fmt.Errorf("no env %s from a ConfigMap", name)
}

// WithComponent is the kustomization.yaml of the overlay named (a folder under
// deploy/overlays) with deploy/components/<component> added to its components, as a user adds
// an optional component to the overlay they install: BuildOverlay builds it under another name
// (its secrets/ files are made anew there).
func WithComponent(root, overlay, component string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "overlays", overlay, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k map[string]any
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("deploy/overlays/%s/kustomization.yaml: %w", overlay, err)
	}
	components, _ := k["components"].([]any)
	k["components"] = append(components, "../../components/"+component)
	return yaml.Marshal(k)
}

// monitoringDocOverlay marks, in docs/install.md, the YAML block that follows as an overlay
// with the monitoring component, built on the overlays it names with `../NAME`:
// "<!-- test/deploy monitoring overlay NAME -->". They are not Installations: their dry run
// needs the Prometheus Operator's CRDs.
var monitoringDocOverlay = regexp.MustCompile("(?m)^<!-- test/deploy monitoring overlay ([a-z0-9-]+) -->\n```yaml\n((?s:.*?))```$")

// MonitoringDocOverlays are the monitoring overlays of docs/install.md, by name.
func MonitoringDocOverlays(root string) (map[string][]byte, error) {
	return docBlocks(root, monitoringDocOverlay, "monitoring overlay")
}
