package admission

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
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
	// Namespaces, when set, are the only namespaces whose writes are sent (less the excluded
	// ones): those of the watched streams. Empty: every namespace but the excluded ones.
	Namespaces []string
	// TimeoutSeconds: 0 means DefaultTimeoutSeconds.
	TimeoutSeconds int32
}

// WebhookConfiguration returns the ValidatingWebhookConfiguration that sends the writes of the
// watched resources to the attribution webhook: failurePolicy Ignore (kubescribe down never
// blocks a write), sideEffects None (the webhook ignores dry runs), matchPolicy Equivalent (a
// write through another version of a resource is seen too), a short timeout, and a namespace
// selector that leaves out kube-system and the excluded namespaces or, with Namespaces, takes
// in those only. It returns nil when there is no resource to watch (an empty rule list would
// match nothing anyway), or no namespace left.
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
	selector := metav1.LabelSelectorRequirement{Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpNotIn, Values: excluded}
	if len(opts.Namespaces) > 0 {
		var in []string
		for _, ns := range opts.Namespaces {
			if ns != "" && !slices.Contains(excluded, ns) && !slices.Contains(in, ns) {
				in = append(in, ns)
			}
		}
		if len(in) == 0 {
			return nil
		}
		slices.Sort(in)
		selector = metav1.LabelSelectorRequirement{Key: namespaceNameLabel, Operator: metav1.LabelSelectorOpIn, Values: in}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   WebhookConfigurationName,
			Labels: map[string]string{"app.kubernetes.io/name": "kubescribe", "app.kubernetes.io/managed-by": "kubescribe"},
		},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "attribution.kubescribe.dev",
			ClientConfig:            opts.ClientConfig,
			Rules:                   rules,
			NamespaceSelector:       &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{selector}},
			FailurePolicy:           &ignore,
			MatchPolicy:             &equivalent,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// Rules turns watched resources into webhook rules, one per (group, operations), in a stable
// order.
func Rules(resources []Resource) []admissionregistrationv1.RuleWithOperations {
	type key struct {
		group, ops string
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
		add(key{r.Group, strings.Join(ops, ",")}, r.Resource)
		if r.Scale && slices.Contains(ops, OpUpdate) {
			add(key{r.Group, OpUpdate}, r.Resource+"/scale")
		}
	}
	keys := make([]key, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := strings.Compare(a.group, b.group); c != 0 {
			return c
		}
		return strings.Compare(a.ops, b.ops)
	})
	out := make([]admissionregistrationv1.RuleWithOperations, 0, len(keys))
	for _, k := range keys {
		// Any scope: the namespace selector applies to namespaced objects only, and a
		// cluster-scoped watched resource is matched too.
		scope := admissionregistrationv1.AllScopes
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

// DefaultServicePort is the port of the Service in front of kubescribe's admission listener.
const DefaultServicePort = 9443

// ClientConfig builds how the apiserver reaches the attribution webhook of cluster route:
// rawURL (https, a host, no user info, query or fragment; a URL without a path gets
// PathPrefix+route) or service ("namespace/name[:port]"), exactly one, and the PEM CA bundle
// that verifies kubescribe's serving certificate.
func ClientConfig(rawURL, service string, caBundle []byte, route string) (admissionregistrationv1.WebhookClientConfig, error) {
	var cc admissionregistrationv1.WebhookClientConfig
	if (rawURL == "") == (service == "") {
		return cc, errors.New("exactly one of a URL and a Service is required")
	}
	if !strings.Contains(string(caBundle), "-----BEGIN CERTIFICATE-----") {
		return cc, errors.New("the CA bundle holds no PEM certificate: the apiserver must verify kubescribe's certificate")
	}
	cc.CABundle = caBundle
	path := PathPrefix + route
	if rawURL != "" {
		u, ok := WebhookURL(rawURL, path)
		if !ok {
			return cc, fmt.Errorf("webhook URL %q: want an https URL with a host, without user info, query or fragment", rawURL)
		}
		cc.URL = &u
		return cc, nil
	}
	ref, err := ServiceReference(service, path)
	if err != nil {
		return cc, fmt.Errorf("service %q: %w", service, err)
	}
	cc.Service = ref
	return cc, nil
}

// WebhookURL checks the URL of a webhook served by kubescribe (https, a host, no user info,
// query or fragment) and gives it path when it has none.
func WebhookURL(rawURL, path string) (string, bool) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = path
	}
	return u.String(), true
}

// ServiceReference parses the Service in front of kubescribe's admission listener, given as
// namespace/name[:port] (DefaultServicePort when no port is given), for a webhook at path.
func ServiceReference(service, path string) (*admissionregistrationv1.ServiceReference, error) {
	port := int32(DefaultServicePort)
	s := service
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err != nil || p < 1 || p > 65535 {
			return nil, errors.New("the port must be a number from 1 to 65535")
		}
		port, s = int32(p), s[:i]
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, errors.New("want namespace/name[:port]")
	}
	return &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Path: &path, Port: &port}, nil
}
