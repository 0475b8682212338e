package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/pager"

	"github.com/kubescribe/kubescribe/internal/declared"
	"github.com/kubescribe/kubescribe/internal/secretenc"
	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

// exportOptions are the flags of `kubescribe export`.
type exportOptions struct {
	dir                              string
	kubeconfig, context              string
	apiGroups, resources, namespaces []string
	overwrite                        bool
	commit                           bool
	message, author, committer       string
	argocdNamespace                  string
	concurrency                      int
	pageSize                         int64
	qps                              float64
	burst                            int
	progress                         string // auto, always, never
	// seal encrypts Secrets for --age-recipient; nil: Secrets are not exported.
	seal *secretenc.Encrypter
}

// exportResource is one resource to list, in one namespace ("" = all, or cluster-scoped).
type exportResource struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}

func (r exportResource) String() string {
	g := r.gvr.Group
	if g == "" {
		g = "core"
	}
	return g + "/" + r.gvr.Resource
}

func exportCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseExportFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "kubescribe export:", err)
		return 2
	}
	if err := runExport(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kubescribe export:", err)
		return 1
	}
	return 0
}

func parseExportFlags(args []string, stderr io.Writer) (*exportOptions, error) {
	o := &exportOptions{}
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context to use (default: the current context)")
	groups := fs.String("api-groups", "*", `API groups to export, comma-separated: "" or "core" is the core group, "*" every group`)
	resources := fs.String("resources", "*", `resources (plural names) to export, comma-separated; "*" is every resource`)
	namespaces := fs.String("namespaces", "", "namespaces to export, comma-separated (default: every namespace, and cluster-scoped objects)")
	fs.BoolVar(&o.overwrite, "overwrite", false, "write into a folder that is not empty (files of objects that no longer exist stay)")
	fs.BoolVar(&o.commit, "commit", false, "commit the folder as one commit in the Git repository that holds it")
	fs.StringVar(&o.message, "message", "", "commit message (default: Export of <context>: <n> objects)")
	fs.StringVar(&o.author, "author", "", `commit author "Name <email>" (default: user.name and user.email of the repository's Git config)`)
	fs.StringVar(&o.committer, "committer", "", `commit committer "Name <email>" (default: the author)`)
	fs.StringVar(&o.argocdNamespace, "argocd-namespace", "argocd", "namespace of Argo CD's argocd-cm ConfigMap, read to warn about objects Argo CD tracks")
	fs.IntVar(&o.concurrency, "concurrency", 4, "resources listed at the same time")
	fs.Int64Var(&o.pageSize, "page-size", 500, "objects per list request")
	fs.Float64Var(&o.qps, "qps", 50, "client-side request rate limit (requests per second)")
	fs.IntVar(&o.burst, "burst", 100, "client-side request burst")
	fs.StringVar(&o.progress, "progress", "auto", "progress display on stderr: auto (only on a terminal), always, never")
	var recipients []string
	fs.Func("age-recipient", "export Secrets too, as SOPS documents encrypted for this age recipient (age1…), as a GitTarget with spec.encryption.age writes them; repeatable", func(v string) error {
		recipients = append(recipients, v)
		return nil
	})
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, errors.New("want exactly one folder to export into, e.g. kubescribe export clusters/prod")
	}
	o.dir = pos[0]
	o.apiGroups = splitList(*groups, true)
	o.resources = splitList(*resources, false)
	o.namespaces = splitList(*namespaces, false)
	switch {
	case len(o.resources) == 0:
		return nil, errors.New("--resources selects nothing")
	case o.concurrency < 1:
		return nil, errors.New("--concurrency must be at least 1")
	case o.pageSize < 1:
		return nil, errors.New("--page-size must be at least 1")
	case o.qps <= 0 || o.burst < 1:
		return nil, errors.New("--qps and --burst must be positive")
	case o.progress != "auto" && o.progress != "always" && o.progress != "never":
		return nil, fmt.Errorf("--progress %q: want auto, always or never", o.progress)
	case !o.commit && (o.message != "" || o.author != "" || o.committer != ""):
		return nil, errors.New("--message, --author and --committer need --commit")
	}
	for _, r := range o.resources {
		if strings.Contains(r, "/") {
			return nil, fmt.Errorf("--resources %q: subresources are not exported", r)
		}
	}
	if len(recipients) > 0 {
		if o.seal, err = secretenc.NewEncrypter(recipients); err != nil {
			return nil, fmt.Errorf("--age-recipient: %w", err)
		}
	}
	return o, nil
}

// splitList splits a comma-separated flag. For API groups, "core", `""` and an empty element
// (`--api-groups ""`, `--api-groups ,apps`) stand for the core group "".
func splitList(s string, groups bool) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if groups && (e == "core" || e == `""`) {
			e = ""
		}
		if e == "" && !groups {
			continue
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// exportStats are counted while the export runs.
type exportStats struct {
	objects   atomic.Int64
	resources atomic.Int64
	forbidden []string
	failed    []string
	mu        sync.Mutex
}

func runExport(ctx context.Context, o *exportOptions, stdout, stderr io.Writer) error {
	began := time.Now()
	if err := prepareDir(o.dir, o.overwrite); err != nil {
		return err
	}
	var repo *exportRepo
	if o.commit {
		var err error
		if repo, err = openExportRepo(o.dir, o.author, o.committer); err != nil {
			return err
		}
	}
	cfg, contextName, err := restConfig(o)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	selected, skipped, err := selectResources(dc, o)
	if err != nil {
		return fmt.Errorf("cannot discover the resources of %s: %w", cfg.Host, err)
	}
	for _, s := range skipped {
		fmt.Fprintln(stderr, "warning:", s)
	}
	if len(selected) == 0 {
		return errors.New("the selection matches no resource the cluster serves (check --api-groups and --resources)")
	}

	gitops := newGitOpsCheck(ctx, dyn, o.argocdNamespace)
	if gitops.argoNote != "" {
		fmt.Fprintln(stderr, gitops.argoNote)
	}
	prog := newProgress(ctx, stderr, o.progress)
	stats := &exportStats{}
	work := make(chan exportResource)
	var wg sync.WaitGroup
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				exportOne(ctx, o, dyn, r, gitops, prog, stats)
			}
		}()
	}
	for _, r := range selected {
		select {
		case work <- r:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	prog.wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted after %d objects: %w", stats.objects.Load(), err)
	}

	gitops.report(stderr)
	for _, f := range stats.forbidden {
		fmt.Fprintln(stderr, "warning: not exported, listing is forbidden:", f)
	}
	elapsed := time.Since(began)
	n := stats.objects.Load()
	rate := float64(n) / max(elapsed.Seconds(), 1e-3)
	fmt.Fprintf(stdout, "exported %s of %s from %s into %s in %s (%.0f objects/s)\n",
		plural(int(n), "object"), plural(int(stats.resources.Load()), "resource"), contextName, o.dir, elapsed.Round(time.Millisecond), rate)
	if argo, flux := gitops.counts(); argo+flux > 0 {
		fmt.Fprintf(stdout, "already managed by another GitOps tool: %d tracked by Argo CD, %d managed by Flux (listed on stderr)\n", argo, flux)
	}
	if len(stats.failed) > 0 {
		for _, f := range stats.failed {
			fmt.Fprintln(stderr, "error:", f)
		}
		return fmt.Errorf("%d resources could not be listed; the export is incomplete and was not committed", len(stats.failed))
	}
	if repo != nil {
		msg := o.message
		if msg == "" {
			msg = fmt.Sprintf("Export of %s: %d objects\n\nWritten by kubescribe export.", contextName, n)
		}
		sha, err := repo.commit(msg)
		switch {
		case errors.Is(err, errNothingToCommit):
			fmt.Fprintln(stdout, "nothing to commit: the folder already holds this state")
		case err != nil:
			return fmt.Errorf("commit: %w", err)
		default:
			fmt.Fprintf(stdout, "committed %s\n", sha)
		}
	}
	return nil
}

// prepareDir creates dir, or checks that it is empty unless overwrite.
func prepareDir(dir string, overwrite bool) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("cannot create the folder: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("cannot read the folder: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") && !overwrite {
			return fmt.Errorf("%s is not empty; export into a new folder, or pass --overwrite (files of objects that no longer exist are then left in place)", dir)
		}
	}
	return nil
}

// restConfig loads the kubeconfig as kubectl does, with the export's rate limits.
func restConfig(o *exportOptions) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kubeconfig != "" {
		if _, err := os.Stat(o.kubeconfig); err != nil {
			return nil, "", fmt.Errorf("--kubeconfig: %w", err)
		}
		rules.ExplicitPath = o.kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	name := o.context
	if name == "" {
		name = raw.CurrentContext
	}
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cfg.UserAgent = "kubescribe-export"
	if name == "" {
		name = cfg.Host
	}
	return cfg, name, nil
}

// selectResources resolves the rules to the resources the cluster serves (its preferred version
// of each), as a WatchRule does. Secrets only with --age-recipient (encrypted); cluster-scoped
// resources only when no namespace is selected. skipped says what was left out, for the user.
func selectResources(dc discovery.DiscoveryInterface, o *exportOptions) (selected []exportResource, skipped []string, err error) {
	lists, err := dc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return nil, nil, err
	}
	if err != nil {
		skipped = append(skipped, fmt.Sprintf("some API groups could not be discovered and are not exported: %v", err))
	}
	var clusterScoped []string
	for _, list := range lists {
		gv, perr := schema.ParseGroupVersion(list.GroupVersion)
		if perr != nil {
			continue
		}
		for _, res := range list.APIResources {
			if strings.Contains(res.Name, "/") || !slices.Contains(res.Verbs, "list") {
				continue
			}
			if !selects(o.apiGroups, gv.Group) || !selects(o.resources, res.Name) {
				continue
			}
			r := exportResource{gvr: gv.WithResource(res.Name), namespaced: res.Namespaced}
			switch {
			case gv.Group == "" && res.Name == "secrets" && o.seal == nil:
				skipped = append(skipped, "Secrets are exported only encrypted (--age-recipient): their data would reach Git unencrypted")
				continue
			case !res.Namespaced && len(o.namespaces) > 0:
				clusterScoped = append(clusterScoped, r.String())
				continue
			}
			selected = append(selected, r)
		}
	}
	if len(clusterScoped) > 0 {
		sort.Strings(clusterScoped)
		skipped = append(skipped, "cluster-scoped resources are not exported with --namespaces: "+strings.Join(clusterScoped, ", "))
	}
	sort.Slice(selected, func(i, j int) bool { return selected[i].String() < selected[j].String() })
	return selected, skipped, nil
}

func selects(patterns []string, s string) bool {
	return slices.Contains(patterns, "*") || slices.Contains(patterns, s)
}

// exportOne lists one resource page by page and writes each object as it arrives: memory holds
// at most a couple of pages per resource being listed, whatever the cluster's size.
func exportOne(ctx context.Context, o *exportOptions, dyn dynamic.Interface, r exportResource, gitops *gitOpsCheck, prog progress, stats *exportStats) {
	scopes := []string{metav1.NamespaceAll}
	if r.namespaced && len(o.namespaces) > 0 {
		scopes = o.namespaces
	}
	bar := prog.start(r.String())
	var written int64
	for _, ns := range scopes {
		var ri dynamic.ResourceInterface = dyn.Resource(r.gvr)
		if r.namespaced {
			ri = dyn.Resource(r.gvr).Namespace(ns)
		}
		first := true
		p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list, err := ri.List(ctx, opts)
			if err == nil && first {
				first = false
				total := int64(len(list.Items))
				if rem := list.GetRemainingItemCount(); rem != nil {
					total += *rem
				}
				bar.addTotal(total)
			}
			return list, err
		})
		p.PageSize = o.pageSize
		p.PageBufferSize = 1
		err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return fmt.Errorf("unexpected list item %T", obj)
			}
			if err := writeObject(o.dir, r, u, o.seal); err != nil {
				return err
			}
			gitops.check(u)
			written++
			stats.objects.Add(1)
			bar.increment()
			return nil
		})
		if err != nil {
			stats.mu.Lock()
			switch {
			case apierrors.IsForbidden(err):
				stats.forbidden = append(stats.forbidden, scopeName(r, ns))
			case ctx.Err() != nil:
			default:
				stats.failed = append(stats.failed, fmt.Sprintf("%s: %v", scopeName(r, ns), err))
			}
			stats.mu.Unlock()
		}
	}
	stats.resources.Add(1)
	bar.done(written)
}

func scopeName(r exportResource, ns string) string {
	if ns == "" {
		return r.String()
	}
	return r.String() + " in namespace " + ns
}

// writeObject writes the object's declared form where the writer keeps it; a Secret encrypted
// by seal, as the writer seals it.
func writeObject(dir string, r exportResource, u *unstructured.Unstructured, seal *secretenc.Encrypter) error {
	rel := manifestanalyzer.ExpectedPath(u.GetNamespace(), r.gvr.Group, r.gvr.Resource, u.GetName())
	b, err := declared.Manifest(u)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if r.gvr.Group == "" && r.gvr.Resource == "secrets" {
		if seal == nil {
			return fmt.Errorf("%s: a Secret is never written unencrypted", rel)
		}
		if b, err = seal.Encrypt(b); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, b, 0o644)
	}
	return nil
}
