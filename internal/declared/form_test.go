package declared

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

type obj = map[string]interface{}
type list = []interface{}

func TestForm(t *testing.T) {
	tests := []struct {
		name string
		in   obj
		want obj
	}{
		{
			name: "server-assigned metadata and status are dropped",
			in: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{
					"name": "a", "namespace": "ns",
					"uid": "u", "resourceVersion": "1", "generation": int64(2),
					"creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-02T00:00:00Z",
					"deletionGracePeriodSeconds": int64(30), "selfLink": "/api/v1/namespaces/ns/configmaps/a",
					"managedFields":   list{obj{"manager": "kubectl"}},
					"ownerReferences": list{obj{"kind": "Deployment", "name": "d", "uid": "x"}},
					"finalizers":      list{"example.com/guard"}, "generateName": "a-",
				},
				"data":   obj{"k": "v"},
				"status": obj{"phase": "Active"},
			},
			want: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{"name": "a", "namespace": "ns"},
				"data":     obj{"k": "v"},
			},
		},
		{
			name: "a metadata field a future API adds stays out",
			in: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{"name": "a", "futureField": obj{"x": "y"}},
			},
			want: obj{"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj{"name": "a"}},
		},
		{
			name: "every top-level field but status is kept, unknown ones too",
			in: obj{
				"apiVersion": "example.com/v1", "kind": "Widget", "metadata": obj{"name": "w"},
				"spec": obj{"size": int64(3)}, "rules": list{}, "extra": "x", "status": obj{"ready": true},
			},
			want: obj{
				"apiVersion": "example.com/v1", "kind": "Widget", "metadata": obj{"name": "w"},
				"spec": obj{"size": int64(3)}, "rules": list{}, "extra": "x",
			},
		},
		{
			name: "cluster-scoped object has no namespace",
			in: obj{
				"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
				"metadata": obj{"name": "r", "namespace": ""}, "rules": list{},
			},
			want: obj{
				"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
				"metadata": obj{"name": "r"}, "rules": list{},
			},
		},
		{
			name: "stamped labels and annotations go, the rest stays",
			in: obj{
				"apiVersion": "v1", "kind": "Service",
				"metadata": obj{
					"name": "s", "namespace": "ns",
					"labels": obj{
						"app.kubernetes.io/instance":            "shop",
						"argocd.argoproj.io/instance":           "shop",
						"kustomize.toolkit.fluxcd.io/name":      "apps",
						"kustomize.toolkit.fluxcd.io/namespace": "flux-system",
						"kustomize.toolkit.fluxcd.io/checksum":  "abc",
						"kustomize.toolkit.fluxcd.io/prune":     "disabled",
						"helm.toolkit.fluxcd.io/name":           "r",
						"helm.toolkit.fluxcd.io/namespace":      "flux-system",
						"tier":                                  "web",
					},
					"annotations": obj{
						"kubectl.kubernetes.io/last-applied-configuration": "{}",
						"argocd.argoproj.io/tracking-id":                   "shop:/Service:ns/s",
						"argocd.argoproj.io/installation-id":               "i",
						"argocd.argoproj.io/sync-wave":                     "2",
						"argocd.argoproj.io/sync-options":                  "Prune=false",
						"kustomize.toolkit.fluxcd.io/checksum":             "abc",
						"kustomize.toolkit.fluxcd.io/ssa":                  "Merge",
						"reconcile.fluxcd.io/requestedAt":                  "2026-03-01T10:00:00Z",
						"meta.helm.sh/release-name":                        "r",
						"deployment.kubernetes.io/revision":                "4",
						"deprecated.daemonset.template.generation":         "2",
						"owner": "team",
					},
				},
			},
			want: obj{
				"apiVersion": "v1", "kind": "Service",
				"metadata": obj{
					"name": "s", "namespace": "ns",
					"labels": obj{
						"app.kubernetes.io/instance":        "shop",
						"kustomize.toolkit.fluxcd.io/prune": "disabled",
						"tier":                              "web",
					},
					"annotations": obj{
						"argocd.argoproj.io/sync-wave":    "2",
						"argocd.argoproj.io/sync-options": "Prune=false",
						"kustomize.toolkit.fluxcd.io/ssa": "Merge",
						"meta.helm.sh/release-name":       "r",
						"owner":                           "team",
					},
				},
			},
		},
		{
			name: "a stamped key is dropped only where the tool writes it",
			in: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{
					"name":        "a",
					"labels":      obj{"deployment.kubernetes.io/revision": "1"},
					"annotations": obj{"kubernetes.io/metadata.name": "a"},
				},
			},
			want: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{
					"name":        "a",
					"labels":      obj{"deployment.kubernetes.io/revision": "1"},
					"annotations": obj{"kubernetes.io/metadata.name": "a"},
				},
			},
		},
		{
			name: "labels and annotations left empty are removed",
			in: obj{
				"apiVersion": "v1", "kind": "Namespace",
				"metadata": obj{
					"name":        "shop",
					"labels":      obj{"kubernetes.io/metadata.name": "shop"},
					"annotations": obj{},
				},
				"spec": obj{"finalizers": list{"kubernetes"}},
			},
			want: obj{
				"apiVersion": "v1", "kind": "Namespace",
				"metadata": obj{"name": "shop"},
				"spec":     obj{"finalizers": list{"kubernetes"}},
			},
		},
		{
			name: "labels that are not a map are dropped",
			in: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{"name": "a", "labels": "oops", "annotations": list{"x"}},
			},
			want: obj{"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj{"name": "a"}},
		},
		{
			name: "labels set as map[string]string are read too",
			in: obj{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": obj{"name": "a", "labels": map[string]string{"a": "b", "kubernetes.io/metadata.name": "a"}},
			},
			want: obj{"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj{"name": "a", "labels": obj{"a": "b"}}},
		},
		{
			name: "empty values that carry meaning in spec and data are kept",
			in: obj{
				"apiVersion": "apps/v1", "kind": "Deployment",
				"metadata": obj{"name": "d", "namespace": "ns"},
				"spec": obj{
					"replicas": int64(0),
					"paused":   false,
					"template": obj{"spec": obj{
						"securityContext": obj{},
						"volumes":         list{obj{"name": "tmp", "emptyDir": obj{}}},
						"containers": list{obj{
							"name": "c", "args": list{}, "command": list{""},
							"env": list{obj{"name": "E", "value": ""}},
						}},
						"nodeSelector": nil,
					}},
				},
			},
			want: obj{
				"apiVersion": "apps/v1", "kind": "Deployment",
				"metadata": obj{"name": "d", "namespace": "ns"},
				"spec": obj{
					"replicas": int64(0),
					"paused":   false,
					"template": obj{"spec": obj{
						"securityContext": obj{},
						"volumes":         list{obj{"name": "tmp", "emptyDir": obj{}}},
						"containers": list{obj{
							"name": "c", "args": list{}, "command": list{""},
							"env": list{obj{"name": "E", "value": ""}},
						}},
						"nodeSelector": nil,
					}},
				},
			},
		},
		{
			name: "nested metadata (a pod template) is spec, kept as is",
			in: obj{
				"apiVersion": "apps/v1", "kind": "Deployment", "metadata": obj{"name": "d"},
				"spec": obj{"template": obj{"metadata": obj{
					"annotations": obj{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
					"labels":      obj{"argocd.argoproj.io/instance": "x"},
				}}},
			},
			want: obj{
				"apiVersion": "apps/v1", "kind": "Deployment", "metadata": obj{"name": "d"},
				"spec": obj{"template": obj{"metadata": obj{
					"annotations": obj{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
					"labels":      obj{"argocd.argoproj.io/instance": "x"},
				}}},
			},
		},
		{
			name: "a metadata with nothing declared left is removed",
			in:   obj{"apiVersion": "v1", "kind": "List", "metadata": obj{"resourceVersion": "9"}, "items": list{}},
			want: obj{"apiVersion": "v1", "kind": "List", "items": list{}},
		},
		{
			name: "an empty object stays empty",
			in:   obj{},
			want: obj{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Form(&unstructured.Unstructured{Object: tt.in})
			require.Equal(t, tt.want, got.Object)
			require.Equal(t, got, Form(got), "Form(Form(x)) == Form(x)")
		})
	}
}

func TestFormNil(t *testing.T) {
	require.Nil(t, Form(nil))
	require.Equal(t, obj{}, Form(&unstructured.Unstructured{}).Object)
}

// Form never writes to its input, and its output shares no container with it.
func TestFormDoesNotMutate(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			before := runtime.DeepCopyJSON(f.obj.Object)
			got := Form(f.obj)
			require.Equal(t, before, f.obj.Object)

			scribble(got.Object)
			require.Equal(t, before, f.obj.Object, "the output aliases the input")
		})
	}
}

// scribble overwrites every map entry and list element it reaches.
func scribble(v interface{}) {
	switch v := v.(type) {
	case map[string]interface{}:
		for k, e := range v {
			scribble(e)
			v[k] = "scribbled"
		}
		v["added"] = true
	case []interface{}:
		for i, e := range v {
			scribble(e)
			v[i] = "scribbled"
		}
	}
}

func TestFormIdempotentOnFixtures(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			once := Form(f.obj)
			require.Equal(t, once, Form(once))
			require.NotContains(t, once.Object, "status")
		})
	}
}

// The table itself: exact keys, each on a known map, none twice, none user intent.
func TestStampedTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range stamped {
		require.NotEmpty(t, s.key)
		require.NotZero(t, s.where, s.key)
		require.Zero(t, s.where&^(onLabels|onAnnotations), s.key)
		require.False(t, seen[s.key], "%s listed twice", s.key)
		seen[s.key] = true
	}
	for _, kept := range []string{
		"app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
		"argocd.argoproj.io/sync-wave", "argocd.argoproj.io/sync-options", "argocd.argoproj.io/compare-options",
		"argocd.argoproj.io/hook", "kustomize.toolkit.fluxcd.io/prune", "kustomize.toolkit.fluxcd.io/ssa",
		"kustomize.toolkit.fluxcd.io/reconcile", "kustomize.toolkit.fluxcd.io/force",
		"meta.helm.sh/release-name", "meta.helm.sh/release-namespace",
	} {
		require.False(t, droppedLabels[kept] || droppedAnnotations[kept], "%s is user intent", kept)
	}
	require.True(t, droppedAnnotations["kubectl.kubernetes.io/last-applied-configuration"])
	require.True(t, droppedAnnotations["argocd.argoproj.io/tracking-id"])
	require.True(t, droppedAnnotations["deployment.kubernetes.io/revision"])
}
