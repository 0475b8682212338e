package admission

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WebhookConfigurationName is the name of the attribution ValidatingWebhookConfiguration.
const WebhookConfigurationName = "kubescribe-attribution"

// DefaultTimeoutSeconds is the webhook's timeout: the handler answers without waiting for
// Redis, so anything slower is kubescribe unreachable, and the write goes on without it.
const DefaultTimeoutSeconds = 2

// namespaceNameLabel is the label the apiserver sets on every Namespace to its own name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// Resource is one watched resource the webhook must see writes of.
type Resource struct {
	Group, Resource string
	// Namespaced: cluster-scoped resources get a rule of their own.
	Namespaced bool
	// Operations are CREATE, UPDATE and DELETE (the watch's create, update, delete); empty
	// means all three.
	Operations []string
	// Scale adds the resource's scale subresource (UPDATE), which writes spec.replicas.
	Scale bool
}

// WebhookOptions describe the attribution webhook configuration.
type WebhookOptions struct {
	// ClientConfig reaches kubescribe: a URL ending in PathPrefix+<route>, or a Service with
	// Path PathPrefix+<route>, and the CA bundle that verifies its serving certificate.
	ClientConfig admissionregistrationv1.WebhookClientConfig
	// Resources are the watched resources.
	Resources []Resource
	// ExcludeNamespaces are never sent to the webhook, besides kube-system (always excluded);
	// put kubescribe's own namespace here.
	ExcludeNamespaces []string
	// TimeoutSeconds: 0 means DefaultTimeoutSeconds.
	TimeoutSeconds int32
}

// WebhookConfiguration returns the ValidatingWebhookConfiguration that sends the writes of the
// watched resources to the attribution webhook: failurePolicy Ignore (kubescribe down never
// blocks a write), sideEffects None (the webhook ignores dry runs), matchPolicy Equivalent (a
// write through another version of a resource is seen too), a short timeout, and a namespace
// selector that leaves out kube-system and the excluded namespaces. It returns nil when there
// is no resource to watch (an empty rule list would match nothing anyway).
func WebhookConfiguration(opts WebhookOptions) *admissionregistrationv1.ValidatingWebhookConfiguration {
	rules := Rules(opts.Resources)
	if len(rules) == 0 {
		return nil
	}
	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	equivalent := admissionregistrationv1.Equivalent
	timeout := opts.TimeoutSeconds
	if timeout <= 0 {
		timeout = DefaultTimeoutSeconds
	}
	excluded := []string{"kube-system"}
	for _, ns := range opts.ExcludeNamespaces {
		if ns != "" && !slices.Contains(excluded, ns) {
			excluded = append(excluded, ns)
		}
	}
	slices.Sort(excluded)
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   WebhookConfigurationName,
			Labels: map[string]string{"app.kubernetes.io/name": "kubescribe", "app.kubernetes.io/managed-by": "kubescribe"},
		},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "attribution.kubescribe.dev",
			ClientConfig: opts.ClientConfig,
			Rules:        rules,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: excluded,
			}}},
			FailurePolicy:           &ignore,
			MatchPolicy:             &equivalent,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// Rules turns watched resources into webhook rules, one per (group, scope, operations), in a
// stable order.
func Rules(resources []Resource) []admissionregistrationv1.RuleWithOperations {
	type key struct {
		group      string
		namespaced bool
		ops        string
	}
	byKey := map[key][]string{}
	add := func(k key, r string) {
		if !slices.Contains(byKey[k], r) {
			byKey[k] = append(byKey[k], r)
		}
	}
	for _, r := range resources {
		ops := normalOps(r.Operations)
		if len(ops) == 0 || r.Resource == "" {
			continue
		}
		add(key{r.Group, r.Namespaced, strings.Join(ops, ",")}, r.Resource)
		if r.Scale && slices.Contains(ops, OpUpdate) {
			add(key{r.Group, r.Namespaced, OpUpdate}, r.Resource+"/scale")
		}
	}
	keys := make([]key, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return strings.Compare(fmt.Sprint(a.group, !a.namespaced, a.ops), fmt.Sprint(b.group, !b.namespaced, b.ops))
	})
	out := make([]admissionregistrationv1.RuleWithOperations, 0, len(keys))
	for _, k := range keys {
		scope := admissionregistrationv1.ClusterScope
		if k.namespaced {
			scope = admissionregistrationv1.NamespacedScope
		}
		var ops []admissionregistrationv1.OperationType
		for _, o := range strings.Split(k.ops, ",") {
			ops = append(ops, admissionregistrationv1.OperationType(o))
		}
		res := byKey[k]
		slices.Sort(res)
		out = append(out, admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{k.group}, APIVersions: []string{"*"}, Resources: res, Scope: &scope,
			},
		})
	}
	return out
}

// normalOps returns the known operations of ops, upper-case, sorted, each once; all three
// when ops is empty.
func normalOps(ops []string) []string {
	if len(ops) == 0 {
		return []string{OpCreate, OpDelete, OpUpdate}
	}
	var out []string
	for _, o := range ops {
		o = strings.ToUpper(o)
		if (o == OpCreate || o == OpUpdate || o == OpDelete) && !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	slices.Sort(out)
	return out
}
