// Package declared turns a live Kubernetes object into its declared form — the part of it a person
// or a GitOps tool declared, without what the API server, controllers and GitOps tools stamp on it —
// and renders that form as stable YAML for Git. docs/declared-form.md describes the rules.
package declared

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

// keptMetadata is the allow-list over metadata, in output order. Every other metadata field
// (uid, resourceVersion, generation, creationTimestamp, deletion*, managedFields, selfLink,
// ownerReferences, finalizers, generateName, and whatever a future API adds) is dropped.
var keptMetadata = []string{"name", "namespace", "labels", "annotations"}

// where tells on which of the two metadata maps a stamped key is dropped.
type where uint8

const (
	onLabels where = 1 << iota
	onAnnotations
)

// stampedKey is one label or annotation key that is written by a tool or by the control plane
// rather than declared by anyone, and is therefore left out of the declared form.
type stampedKey struct {
	key   string
	where where
}

// stamped is the table of dropped labels and annotations. Only keys confirmed to be written by a
// tool or by Kubernetes itself are listed; docs/declared-form.md cites a source for each and lists
// the keys deliberately kept. Keys are matched exactly, never by prefix: sibling keys under the same
// prefix (argocd.argoproj.io/sync-wave, kustomize.toolkit.fluxcd.io/prune, …) are user intent.
var stamped = []stampedKey{
	// kubectl (client-side apply) stores the whole previously applied object here; it duplicates
	// the declared form and changes on every apply.
	{"kubectl.kubernetes.io/last-applied-configuration", onAnnotations},

	// Argo CD's resource-tracking annotation (<app>:<group>/<kind>:<namespace>/<name>), written on
	// every object it syncs with the `annotation` (default since v3.0) or `annotation+label` method.
	{"argocd.argoproj.io/tracking-id", onAnnotations},
	// Argo CD writes its installationID (argocd-cm) next to the tracking id when one is configured.
	{"argocd.argoproj.io/installation-id", onAnnotations},
	// Argo CD's tracking label when argocd-cm sets application.instanceLabelKey to it (the key the
	// Argo CD docs use as their example). Only Argo CD writes keys under argocd.argoproj.io/, and it
	// overwrites this one with the Application name on every sync. The default tracking label,
	// app.kubernetes.io/instance, is deliberately NOT listed: it is a Kubernetes recommended label
	// that Helm charts and people set themselves, and which key Argo CD uses is configuration
	// (argocd-cm) that the declared form cannot see.
	{"argocd.argoproj.io/instance", onLabels},

	// Flux kustomize-controller marks every object it applies with the owning Kustomization.
	{"kustomize.toolkit.fluxcd.io/name", onLabels},
	{"kustomize.toolkit.fluxcd.io/namespace", onLabels},
	// Flux kustomize-controller's garbage-collection checksum of the whole Kustomization build:
	// first a label (kustomize-controller#112), then an annotation (kustomize-controller#362).
	// Later releases track objects in .status.inventory instead, but objects applied by the older
	// ones still carry it. It changes whenever any object of the Kustomization changes.
	{"kustomize.toolkit.fluxcd.io/checksum", onLabels | onAnnotations},
	// Flux helm-controller's post-renderer marks every object of a release with its HelmRelease.
	{"helm.toolkit.fluxcd.io/name", onLabels},
	{"helm.toolkit.fluxcd.io/namespace", onLabels},
	// `flux reconcile` (and the documented kubectl equivalent) writes a fresh timestamp here to
	// request a reconcile now: an operational request, not declared state.
	{"reconcile.fluxcd.io/requestedAt", onAnnotations},

	// The deployment controller records the rollout revision on each Deployment (and ReplicaSet).
	{"deployment.kubernetes.io/revision", onAnnotations},
	// The kube-apiserver renders a DaemonSet's internal template generation as this annotation.
	{"deprecated.daemonset.template.generation", onAnnotations},
	// The kube-apiserver sets this label on every Namespace to the Namespace's own name.
	{"kubernetes.io/metadata.name", onLabels},
	// The kube-apiserver stamps the day a legacy service-account token Secret was last used.
	{"kubernetes.io/legacy-token-last-used", onLabels},
}

// droppedLabels and droppedAnnotations index the stamped table.
var droppedLabels, droppedAnnotations = func() (map[string]bool, map[string]bool) {
	labels, annotations := map[string]bool{}, map[string]bool{}
	for _, s := range stamped {
		if s.where&onLabels != 0 {
			labels[s.key] = true
		}
		if s.where&onAnnotations != 0 {
			annotations[s.key] = true
		}
	}
	return labels, annotations
}()

// Form returns the declared form of obj (never mutates obj): apiVersion, kind, metadata.{name,
// namespace, labels, annotations} without the stamped keys, and every other top-level field except
// status, deep-copied. Labels or annotations left empty are removed, and so is a metadata left
// empty. Values inside spec, data and the like are kept exactly, empty ones included. Form of a
// declared form is that same form. A nil obj gives nil.
func Form(obj *unstructured.Unstructured) *unstructured.Unstructured {
	if obj == nil {
		return nil
	}
	out := make(map[string]interface{}, len(obj.Object))
	for k, v := range obj.Object {
		switch k {
		case "status":
			continue
		case "metadata":
			if md := declaredMetadata(v); len(md) > 0 {
				out[k] = md
			}
			continue
		}
		out[k] = copyValue(v)
	}
	return &unstructured.Unstructured{Object: out}
}

// declaredMetadata applies the metadata allow-list. A metadata that is not a map is dropped whole.
func declaredMetadata(v interface{}) map[string]interface{} {
	md, ok := v.(map[string]interface{})
	if !ok {
		return nil
	}
	out := make(map[string]interface{}, len(keptMetadata))
	for _, k := range []string{"name", "namespace"} {
		if v, ok := md[k]; ok && v != nil && v != "" {
			out[k] = copyValue(v)
		}
	}
	if m := withoutKeys(md["labels"], droppedLabels); len(m) > 0 {
		out["labels"] = m
	}
	if m := withoutKeys(md["annotations"], droppedAnnotations); len(m) > 0 {
		out["annotations"] = m
	}
	return out
}

// withoutKeys copies a labels or annotations map without the dropped keys. Anything that is not a
// map (not a valid labels or annotations value) gives nil, so it is dropped.
func withoutKeys(v interface{}, dropped map[string]bool) map[string]interface{} {
	var out map[string]interface{}
	switch m := v.(type) {
	case map[string]interface{}:
		out = make(map[string]interface{}, len(m))
		for k, v := range m {
			if !dropped[k] {
				out[k] = copyValue(v)
			}
		}
	case map[string]string:
		out = make(map[string]interface{}, len(m))
		for k, v := range m {
			if !dropped[k] {
				out[k] = v
			}
		}
	}
	return out
}

// copyValue deep-copies the containers unstructured content is made of. Other values are immutable
// scalars (string, bool, int64, float64, json.Number, nil) and are shared.
func copyValue(v interface{}) interface{} {
	switch v := v.(type) {
	case map[string]interface{}:
		if v == nil {
			return v
		}
		out := make(map[string]interface{}, len(v))
		for k, e := range v {
			out[k] = copyValue(e)
		}
		return out
	case []interface{}:
		if v == nil {
			return v
		}
		out := make([]interface{}, len(v))
		for i, e := range v {
			out[i] = copyValue(e)
		}
		return out
	case map[string]string:
		if v == nil {
			return v
		}
		out := make(map[string]string, len(v))
		for k, e := range v {
			out[k] = e
		}
		return out
	case []string:
		if v == nil {
			return v
		}
		return append([]string(nil), v...)
	default:
		return v
	}
}
