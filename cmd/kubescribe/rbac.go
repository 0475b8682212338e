package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// rbacManagedBy labels every object `kubescribe rbac` prints, so that a later run's stale
// objects can be found (and pruned).
const rbacManagedBy = "kubescribe-rbac"

// rbacOptions are the flags of `kubescribe rbac`.
type rbacOptions struct {
	kubeconfig, context string
	files               []string
	name                string
	subjects            []rbacv1.Subject
	// sourceCluster, when set, prints the grant of a remote source cluster (the audit route of
	// its GitTargets): rules come from files, discovery from the kubeconfig (the remote's).
	sourceCluster string
}

// rbacInput is what the grant is computed from: kubescribe's objects, from the cluster or from
// files.
type rbacInput struct {
	watchRules        []v1alpha1.WatchRule
	clusterWatchRules []v1alpha1.ClusterWatchRule
	providers         []v1alpha1.GitProvider
	targets           []v1alpha1.GitTarget
}

func rbacCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseRBACFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "kubescribe rbac:", err)
		return 2
	}
	if err := runRBAC(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kubescribe rbac:", err)
		return 1
	}
	return 0
}

func parseRBACFlags(args []string, stderr io.Writer) (*rbacOptions, error) {
	o := &rbacOptions{}
	fs := flag.NewFlagSet("rbac", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context to use (default: the current context)")
	var files, sas, users, groups listFlag
	fs.Var(&files, "f", `read WatchRules, ClusterWatchRules, GitProviders and GitTargets from this YAML file, a folder of them, or "-" (stdin) instead of the cluster; repeatable`)
	fs.Var(&files, "filename", "same as -f")
	fs.Var(&sas, "service-account", "grant to this ServiceAccount, NAMESPACE/NAME; repeatable (default: kubescribe/kubescribe, or kubescribe-source/kubescribe-source with --source-cluster)")
	fs.Var(&users, "user", "grant to this user; repeatable")
	fs.Var(&groups, "group", "grant to this group; repeatable")
	fs.StringVar(&o.name, "name", "kubescribe-rules", "name of the ClusterRole, Roles and their bindings")
	fs.StringVar(&o.sourceCluster, "source-cluster", "", "print the grant for the remote source cluster of this audit route (GitTarget spec.sourceCluster.auditRoute), to apply there: needs -f, and --kubeconfig/--context must reach that cluster")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, fmt.Errorf("unexpected argument %q: the rules come from the cluster or from -f", pos[0])
	}
	o.files = files
	if o.sourceCluster != "" && len(o.files) == 0 {
		return nil, errors.New("--source-cluster needs -f: the kubeconfig reaches the remote cluster, which holds no rules")
	}
	if o.name == "" || strings.ContainsAny(o.name, "/%") {
		return nil, fmt.Errorf("--name %q: want a Kubernetes object name", o.name)
	}
	for _, sa := range sas {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--service-account %q: want NAMESPACE/NAME", sa)
		}
		o.subjects = append(o.subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name})
	}
	for _, u := range users {
		if u == "" {
			return nil, errors.New("--user: empty name")
		}
		o.subjects = append(o.subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u})
	}
	for _, g := range groups {
		if g == "" {
			return nil, errors.New("--group: empty name")
		}
		o.subjects = append(o.subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: g})
	}
	if len(o.subjects) == 0 {
		sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "kubescribe", Name: "kubescribe"}
		if o.sourceCluster != "" {
			sa.Namespace, sa.Name = "kubescribe-source", "kubescribe-source"
		}
		o.subjects = []rbacv1.Subject{sa}
	}
	return o, nil
}

func runRBAC(ctx context.Context, o *rbacOptions, stdout, stderr io.Writer) error {
	var in rbacInput
	if len(o.files) > 0 {
		for _, f := range o.files {
			if err := in.readPath(f); err != nil {
				return err
			}
		}
	}
	cfg, contextName, err := restConfig(&exportOptions{kubeconfig: o.kubeconfig, context: o.context, qps: 50, burst: 100})
	if err != nil {
		return err
	}
	cfg.UserAgent = "kubescribe-rbac"
	if len(o.files) == 0 {
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
		if err := in.readCluster(ctx, dyn); err != nil {
			return fmt.Errorf("reading kubescribe's objects from %s: %w", contextName, err)
		}
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	catalog, err := watch.NewCatalog(ctx, dc)
	if err != nil {
		return fmt.Errorf("cannot discover the resources of %s: %w", contextName, err)
	}
	plan, warnings := planRBAC(catalog, &in, o.sourceCluster)
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	out, err := plan.render(o.name, o.subjects, contextName)
	if err != nil {
		return err
	}
	if plan.empty() {
		fmt.Fprintln(stderr, "warning: nothing to grant: no rule selects a resource the cluster serves, and no GitProvider or GitTarget names a Secret")
	}
	_, err = stdout.Write(out)
	return err
}

// readCluster lists kubescribe's objects, in every namespace.
func (in *rbacInput) readCluster(ctx context.Context, dyn dynamic.Interface) error {
	for _, gvr := range []schema.GroupVersionResource{v1alpha1.WatchRulesResource, v1alpha1.ClusterWatchRulesResource,
		v1alpha1.GitProvidersResource, v1alpha1.GitTargetsResource} {
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing %s: %w", gvr.Resource, err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
			if u.GetKind() == "" {
				u.SetKind(strings.TrimSuffix(list.GetKind(), "List"))
			}
			if err := in.add(u); err != nil {
				return err
			}
		}
	}
	return nil
}

// readPath reads a file, every .yaml, .yml and .json file of a folder (not below it), or stdin
// for "-".
func (in *rbacInput) readPath(path string) error {
	if path == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return fmt.Errorf("reading stdin: %w", err)
		}
		return in.readManifests("stdin", b)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("-f: %w", err)
	}
	files := []string{path}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return fmt.Errorf("-f: %w", err)
		}
		files = files[:0]
		for _, e := range entries {
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					files = append(files, filepath.Join(path, e.Name()))
				}
			}
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("-f: %w", err)
		}
		if err := in.readManifests(f, b); err != nil {
			return err
		}
	}
	return nil
}

// readManifests reads kubescribe's objects from a YAML or JSON stream; other objects (the
// Secrets next to a GitProvider, a Namespace) are skipped, and so are kubectl's List wrappers'
// non-kubescribe items.
func (in *rbacInput) readManifests(name string, b []byte) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for doc := 1; ; doc++ {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.IsList() {
			err := u.EachListItem(func(item runtime.Object) error {
				return in.add(item.(*unstructured.Unstructured))
			})
			if err != nil {
				return fmt.Errorf("%s: document %d: %w", name, doc, err)
			}
			continue
		}
		if err := in.add(u); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
	}
}

// add keeps u when it is one of the kinds the grant depends on.
func (in *rbacInput) add(u *unstructured.Unstructured) error {
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil || gv.Group != v1alpha1.SchemeGroupVersion.Group {
		return nil
	}
	var target any
	switch u.GetKind() {
	case "WatchRule":
		in.watchRules = append(in.watchRules, v1alpha1.WatchRule{})
		target = &in.watchRules[len(in.watchRules)-1]
	case "ClusterWatchRule":
		in.clusterWatchRules = append(in.clusterWatchRules, v1alpha1.ClusterWatchRule{})
		target = &in.clusterWatchRules[len(in.clusterWatchRules)-1]
	case "GitProvider":
		in.providers = append(in.providers, v1alpha1.GitProvider{})
		target = &in.providers[len(in.providers)-1]
	case "GitTarget":
		in.targets = append(in.targets, v1alpha1.GitTarget{})
		target = &in.targets[len(in.targets)-1]
	default:
		return nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, target); err != nil {
		return fmt.Errorf("%s %q: %w", u.GetKind(), u.GetName(), err)
	}
	// A manifest may leave a namespaced object's namespace to kubectl's context.
	switch t := target.(type) {
	case *v1alpha1.WatchRule:
		if t.Namespace == "" {
			t.Namespace = "default"
		}
	case *v1alpha1.GitProvider:
		if t.Namespace == "" {
			t.Namespace = "default"
		}
	case *v1alpha1.GitTarget:
		if t.Namespace == "" {
			t.Namespace = "default"
		}
	}
	return nil
}

// rbacPlan is the grant: per namespace ("" is cluster-wide) the resources to list and watch
// and the Secrets to get, and why.
type rbacPlan struct {
	scopes map[string]*rbacScope
}

type rbacScope struct {
	// resources to list and watch, by API group.
	resources map[string][]string
	// secrets to get, by name.
	secrets []string
	// why names the objects the grant is for.
	why []string
}

func (p *rbacPlan) scope(ns string) *rbacScope {
	if p.scopes == nil {
		p.scopes = map[string]*rbacScope{}
	}
	s, ok := p.scopes[ns]
	if !ok {
		s = &rbacScope{resources: map[string][]string{}}
		p.scopes[ns] = s
	}
	return s
}

func (s *rbacScope) addResource(gvr schema.GroupVersionResource) {
	if !slices.Contains(s.resources[gvr.Group], gvr.Resource) {
		s.resources[gvr.Group] = append(s.resources[gvr.Group], gvr.Resource)
	}
}

func (s *rbacScope) addWhy(why string) {
	if !slices.Contains(s.why, why) {
		s.why = append(s.why, why)
	}
}

func (p *rbacPlan) empty() bool {
	for _, s := range p.scopes {
		if len(s.resources) > 0 || len(s.secrets) > 0 {
			return false
		}
	}
	return true
}

// planRBAC computes the grant the objects of in need, resolving their rules in catalog as
// kubescribe does: Secrets are mirrored only for a GitTarget with spec.encryption.age, so only
// its rules that select them are granted list and watch on them; a
// WatchRule reads only its own namespace; a ClusterWatchRule reads cluster-scoped resources
// and namespaced ones in spec.namespaces, or everywhere (with a namespaceSelector too: the
// namespaces it selects change with their labels). Without sourceCluster, rules of GitTargets
// that mirror a remote cluster are left out (their grant belongs on that cluster), and the
// Secrets GitProviders and GitTargets name are granted with get. With sourceCluster, only the
// rules of GitTargets mirroring that cluster count, and no Secret is granted: kubescribe
// reads none there. warnings say what was left out.
func planRBAC(catalog *watch.Catalog, in *rbacInput, sourceCluster string) (*rbacPlan, []string) {
	plan := &rbacPlan{}
	var warnings []string
	targets := map[string]*v1alpha1.GitTarget{}
	for i := range in.targets {
		t := &in.targets[i]
		targets[t.Namespace+"/"+t.Name] = t
	}
	// counts says whether the rules of target ns/name are granted in this run.
	counts := func(what, ns, name string) bool {
		t, ok := targets[ns+"/"+name]
		route := ""
		if ok && t.Spec.SourceCluster != nil {
			route = t.Spec.SourceCluster.AuditRoute
		}
		switch {
		case !ok && sourceCluster == "":
			warnings = append(warnings, fmt.Sprintf("%s: GitTarget %s/%s not found; granted as if it mirrored this cluster", what, ns, name))
			return true
		case !ok:
			warnings = append(warnings, fmt.Sprintf("%s: GitTarget %s/%s not found; left out, as it may not mirror source cluster %q", what, ns, name, sourceCluster))
			return false
		case route == sourceCluster:
			return true
		case sourceCluster == "":
			warnings = append(warnings, fmt.Sprintf("%s: GitTarget %s/%s mirrors source cluster %q; its grant belongs on that cluster: kubescribe rbac --source-cluster %s -f RULES --kubeconfig REMOTE", what, ns, name, route, route))
		}
		return false
	}
	// encrypts says whether GitTarget ns/name mirrors Secrets (encrypted for its age
	// recipients): only then are they resolved, and granted.
	encrypts := func(ns, name string) bool {
		t, ok := targets[ns+"/"+name]
		return ok && t.Spec.Encryption != nil && len(t.Spec.Encryption.Age) > 0
	}
	resolve := func(what string, rules []v1alpha1.ResourceRule, namespacedOnly, secrets bool) watch.Resolution {
		sels := make([]watch.Selector, len(rules))
		for i, r := range rules {
			sels[i] = watch.Selector{APIGroups: r.APIGroups, APIVersions: r.APIVersions, Resources: r.Resources, AllowSecrets: secrets}
		}
		res := catalog.Resolve(sels, namespacedOnly)
		for _, u := range res.Unresolved {
			warnings = append(warnings, fmt.Sprintf("%s rules[%d] %q in apiGroups %s: %s; nothing granted for it", what, u.Selector, u.Resource,
				formatRBACGroups(rules[u.Selector].APIGroups), unresolvedWhy(u.Reason)))
		}
		return res
	}

	for _, r := range in.watchRules {
		what := fmt.Sprintf("WatchRule %s/%s", r.Namespace, r.Name)
		if !counts(what, r.Namespace, r.Spec.TargetRef.Name) {
			continue
		}
		res := resolve(what, r.Spec.Rules, true, encrypts(r.Namespace, r.Spec.TargetRef.Name))
		if len(res.Resources) == 0 {
			continue
		}
		s := plan.scope(r.Namespace)
		for _, rr := range res.Resources {
			s.addResource(rr.GVR)
		}
		s.addWhy(what)
	}
	for _, r := range in.clusterWatchRules {
		what := fmt.Sprintf("ClusterWatchRule %s", r.Name)
		if len(r.Spec.Namespaces) > 0 && r.Spec.NamespaceSelector != nil {
			warnings = append(warnings, what+": sets both namespaces and namespaceSelector, so kubescribe mirrors nothing for it (InvalidSpec); nothing granted")
			continue
		}
		if !counts(what, r.Spec.TargetRef.Namespace, r.Spec.TargetRef.Name) {
			continue
		}
		res := resolve(what, r.Spec.Rules, false, encrypts(r.Spec.TargetRef.Namespace, r.Spec.TargetRef.Name))
		for _, rr := range res.Resources {
			switch {
			case !rr.Namespaced:
				s := plan.scope("")
				s.addResource(rr.GVR)
				s.addWhy(what + " (cluster-scoped resources)")
			case len(r.Spec.Namespaces) > 0:
				for _, ns := range r.Spec.Namespaces {
					s := plan.scope(ns)
					s.addResource(rr.GVR)
					s.addWhy(what)
				}
			case r.Spec.NamespaceSelector != nil:
				s := plan.scope("")
				s.addResource(rr.GVR)
				s.addWhy(what + " (its namespaceSelector follows namespaces as they are labelled, so in every namespace)")
			default:
				s := plan.scope("")
				s.addResource(rr.GVR)
				s.addWhy(what + " (every namespace)")
			}
		}
	}
	if sourceCluster == "" {
		for _, p := range in.providers {
			refs := map[string]string{}
			if p.Spec.SecretRef != nil && p.Spec.SecretRef.Name != "" {
				refs["spec.secretRef"] = p.Spec.SecretRef.Name
			}
			if p.Spec.Signing != nil && p.Spec.Signing.SecretRef.Name != "" {
				refs["spec.signing.secretRef"] = p.Spec.Signing.SecretRef.Name
			}
			for _, field := range slices.Sorted(maps.Keys(refs)) {
				s := plan.scope(p.Namespace)
				if !slices.Contains(s.secrets, refs[field]) {
					s.secrets = append(s.secrets, refs[field])
				}
				s.addWhy(fmt.Sprintf("GitProvider %s/%s (%s)", p.Namespace, p.Name, field))
			}
		}
		for _, t := range in.targets {
			if t.Spec.SourceCluster == nil || t.Spec.SourceCluster.KubeConfigSecretRef.Name == "" {
				continue
			}
			s := plan.scope(t.Namespace)
			name := t.Spec.SourceCluster.KubeConfigSecretRef.Name
			if !slices.Contains(s.secrets, name) {
				s.secrets = append(s.secrets, name)
			}
			s.addWhy(fmt.Sprintf("GitTarget %s/%s (spec.sourceCluster.kubeConfigSecretRef)", t.Namespace, t.Name))
		}
	}
	// A namespace's Role repeats nothing the ClusterRole grants everywhere already.
	if cluster, ok := plan.scopes[""]; ok {
		for ns, s := range plan.scopes {
			if ns == "" {
				continue
			}
			for g, rs := range s.resources {
				s.resources[g] = slices.DeleteFunc(rs, func(r string) bool { return slices.Contains(cluster.resources[g], r) })
				if len(s.resources[g]) == 0 {
					delete(s.resources, g)
				}
			}
		}
	}
	return plan, warnings
}

func unresolvedWhy(r watch.UnresolvedReason) string {
	switch r {
	case watch.UnresolvedSecret:
		return "Secrets are mirrored only for a GitTarget with spec.encryption.age (docs/security.md#secrets-in-git)"
	case watch.UnresolvedClusterScoped:
		return "cluster-scoped, and a WatchRule mirrors only its own namespace"
	case watch.UnresolvedNotListable:
		return "served without the list and watch verbs"
	case watch.UnresolvedVersionNotServed:
		return "served, but in none of the rule's apiVersions"
	case watch.UnresolvedNotServed:
		return "not served by the cluster (yet): run again once its CRD is established or its API is available"
	}
	return string(r)
}

func formatRBACGroups(groups []string) string {
	q := make([]string, len(groups))
	for i, g := range groups {
		q[i] = fmt.Sprintf("%q", g)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// render prints the plan as YAML documents for kubectl apply -f -: the ClusterRole and its
// ClusterRoleBinding for the cluster-wide grant, a Role and RoleBinding per namespace, each
// with a comment saying what it is for.
func (p *rbacPlan) render(name string, subjects []rbacv1.Subject, contextName string) ([]byte, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Generated by `kubescribe rbac` from %s, for %s.\n", contextName, describeSubjects(subjects))
	buf.WriteString("# List and watch of what the rules select (never Secrets), and get of the Secrets that\n")
	buf.WriteString("# GitProviders and GitTargets name. Re-run it when they change; objects of an earlier run this\n")
	fmt.Fprintf(&buf, "# one no longer prints keep their grant until deleted (label app.kubernetes.io/managed-by=%s).\n", rbacManagedBy)
	labels := map[string]string{"app.kubernetes.io/name": "kubescribe", "app.kubernetes.io/managed-by": rbacManagedBy}
	namespaces := make([]string, 0, len(p.scopes))
	for ns := range p.scopes {
		namespaces = append(namespaces, ns)
	}
	sort.Strings(namespaces)
	for _, ns := range namespaces {
		s := p.scopes[ns]
		rules := s.policyRules()
		if len(rules) == 0 {
			continue
		}
		meta := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}
		var role, binding any
		if ns == "" {
			ref.Kind = "ClusterRole"
			role = &rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}, ObjectMeta: meta, Rules: rules}
			binding = &rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"}, ObjectMeta: meta, RoleRef: ref, Subjects: subjects}
		} else {
			role = &rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta, Rules: rules}
			binding = &rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}, ObjectMeta: meta, RoleRef: ref, Subjects: subjects}
		}
		where := "cluster-wide"
		if ns != "" {
			where = "in namespace " + ns
		}
		buf.WriteString("---\n")
		fmt.Fprintf(&buf, "# %s, for:\n", where)
		for _, w := range s.why {
			fmt.Fprintf(&buf, "#   %s\n", w)
		}
		for _, obj := range []any{role, binding} {
			b, err := marshalRBAC(obj)
			if err != nil {
				return nil, err
			}
			if obj == binding {
				buf.WriteString("---\n")
			}
			buf.Write(b)
		}
	}
	return buf.Bytes(), nil
}

// policyRules are the scope's rules: list and watch per API group, get on the named Secrets.
func (s *rbacScope) policyRules() []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	groups := make([]string, 0, len(s.resources))
	for g := range s.resources {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	for _, g := range groups {
		rs := slices.Clone(s.resources[g])
		sort.Strings(rs)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: rs, Verbs: []string{"list", "watch"}})
	}
	if len(s.secrets) > 0 {
		names := slices.Clone(s.secrets)
		sort.Strings(names)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: names, Verbs: []string{"get"}})
	}
	return rules
}

// marshalRBAC is the object's YAML without the empty creationTimestamp ObjectMeta carries.
func marshalRBAC(obj any) ([]byte, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	return yaml.Marshal(m)
}

func describeSubjects(subjects []rbacv1.Subject) string {
	out := make([]string, len(subjects))
	for i, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind {
			out[i] = fmt.Sprintf("ServiceAccount %s/%s", s.Namespace, s.Name)
		} else {
			out[i] = fmt.Sprintf("%s %s", s.Kind, s.Name)
		}
	}
	return strings.Join(out, ", ")
}
