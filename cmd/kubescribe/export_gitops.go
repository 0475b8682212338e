package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Argo CD's configuration and tracking keys (Argo CD "Resource Tracking" docs).
const (
	argoConfigMap          = "argocd-cm"
	argoTrackingMethodKey  = "application.resourceTrackingMethod"
	argoInstanceLabelKey   = "application.instanceLabelKey"
	argoTrackingAnnotation = "argocd.argoproj.io/tracking-id"
	// argoBuiltinLabel is the label Argo CD uses when argocd-cm sets no instanceLabelKey. It is
	// also a Kubernetes recommended label that Helm and people set, so a match under it is
	// reported as "possibly tracked".
	argoBuiltinLabel = "app.kubernetes.io/instance"
)

// fluxManagers are the field managers Flux's controllers apply with (server-side apply).
var fluxManagers = []string{"kustomize-controller", "helm-controller"}

// maxListed bounds the objects named per tool; the rest are counted.
const maxListed = 20

// gitOpsCheck finds exported objects that Argo CD or Flux already manage. A cluster with
// neither is the normal case: nothing is reported.
type gitOpsCheck struct {
	argo bool // argocd-cm was found
	// checkAnnotation, labelKey: what marks an object Argo CD tracks under argocd-cm's method.
	checkAnnotation bool
	labelKey        string
	labelAssumed    bool // labelKey is Argo CD's built-in key: argocd-cm sets none
	// argoNote describes what was read from argocd-cm (or why it could not be), for the user.
	argoNote string

	mu         sync.Mutex
	argoCount  int
	fluxCount  int
	argoListed []string
	fluxListed []string
}

// newGitOpsCheck reads argocd-cm from namespace ns. Not found means no Argo CD; forbidden or any
// other error is noted and the Argo CD check is skipped; the export goes on.
func newGitOpsCheck(ctx context.Context, dyn dynamic.Interface, ns string) *gitOpsCheck {
	g := &gitOpsCheck{}
	cm, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(ns).Get(ctx, argoConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return g
	case err != nil:
		g.argoNote = fmt.Sprintf("warning: cannot read ConfigMap %s/%s (%v): objects tracked by Argo CD are not detected", ns, argoConfigMap, err)
		return g
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	g.configure(data[argoTrackingMethodKey], data[argoInstanceLabelKey])
	g.argoNote = fmt.Sprintf("Argo CD found (ConfigMap %s/%s): %s", ns, argoConfigMap, g.describeArgo(data[argoTrackingMethodKey]))
	return g
}

// configure sets what marks an Argo CD-tracked object from argocd-cm's settings. No default is
// assumed for the method: unset (or unknown) checks both the annotation and the label.
func (g *gitOpsCheck) configure(method, labelKey string) {
	g.argo = true
	g.labelKey, g.labelAssumed = labelKey, false
	if g.labelKey == "" {
		g.labelKey, g.labelAssumed = argoBuiltinLabel, true
	}
	switch method {
	case "annotation", "annotation+label":
		// annotation+label tracks by the annotation; the label is only informational.
		g.checkAnnotation, g.labelKey = true, ""
	case "label":
		g.checkAnnotation = false
	default:
		g.checkAnnotation = true
	}
}

func (g *gitOpsCheck) describeArgo(method string) string {
	var what []string
	if g.checkAnnotation {
		what = append(what, "annotation "+argoTrackingAnnotation)
	}
	if g.labelKey != "" {
		l := "label " + g.labelKey
		if g.labelAssumed {
			l += " (Argo CD's built-in key: " + argoInstanceLabelKey + " is not set)"
		}
		what = append(what, l)
	}
	m := fmt.Sprintf("%s %q", argoTrackingMethodKey, method)
	if method == "" {
		m = argoTrackingMethodKey + " is not set, so both are checked"
	}
	return m + "; objects with the " + strings.Join(what, " or the ") + " are reported"
}

// argoTracked says how Argo CD tracks u, or "" when it does not.
func (g *gitOpsCheck) argoTracked(u *unstructured.Unstructured) string {
	if !g.argo {
		return ""
	}
	if g.checkAnnotation {
		if v, ok := u.GetAnnotations()[argoTrackingAnnotation]; ok {
			return fmt.Sprintf("annotation %s=%s", argoTrackingAnnotation, v)
		}
	}
	if g.labelKey != "" {
		if v, ok := u.GetLabels()[g.labelKey]; ok {
			if g.labelAssumed {
				return fmt.Sprintf("label %s=%s; possibly: Helm and people set this label too", g.labelKey, v)
			}
			return fmt.Sprintf("label %s=%s", g.labelKey, v)
		}
	}
	return ""
}

// fluxManaged names the Flux field manager of u, or "".
func fluxManaged(u *unstructured.Unstructured) string {
	for _, mf := range u.GetManagedFields() {
		for _, m := range fluxManagers {
			if mf.Manager == m {
				return m
			}
		}
	}
	return ""
}

func (g *gitOpsCheck) check(u *unstructured.Unstructured) {
	argo, flux := g.argoTracked(u), fluxManaged(u)
	if argo == "" && flux == "" {
		return
	}
	id := describeObject(u)
	g.mu.Lock()
	defer g.mu.Unlock()
	if argo != "" {
		g.argoCount++
		if len(g.argoListed) < maxListed {
			g.argoListed = append(g.argoListed, fmt.Sprintf("warning: Argo CD tracks %s (%s)", id, argo))
		}
	}
	if flux != "" {
		g.fluxCount++
		if len(g.fluxListed) < maxListed {
			g.fluxListed = append(g.fluxListed, fmt.Sprintf("warning: Flux manages %s (field manager %s)", id, flux))
		}
	}
}

func describeObject(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetKind() + " " + u.GetName()
	}
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

func (g *gitOpsCheck) counts() (argo, flux int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.argoCount, g.fluxCount
}

// report writes the warnings, sorted, with a count of those not named.
func (g *gitOpsCheck) report(w io.Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range []struct {
		lines []string
		count int
		tool  string
	}{{g.argoListed, g.argoCount, "Argo CD"}, {g.fluxListed, g.fluxCount, "Flux"}} {
		sort.Strings(l.lines)
		for _, s := range l.lines {
			fmt.Fprintln(w, s)
		}
		if l.count > len(l.lines) {
			fmt.Fprintf(w, "warning: ... and %d more objects managed by %s\n", l.count-len(l.lines), l.tool)
		}
	}
	if g.argoCount+g.fluxCount > 0 {
		fmt.Fprintln(w, "warning: a GitTarget on these objects and the GitOps tool that manages them would each write the other's changes; decide which one owns them")
	}
}
