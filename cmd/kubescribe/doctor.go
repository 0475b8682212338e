package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubescribe/kubescribe/internal/safetext"
)

// The exit codes of `kubescribe doctor`.
const (
	exitDoctorHealthy = 0 // no check failed (warnings and checks that could not run aside)
	exitDoctorFailed  = 1 // at least one check failed
	exitDoctorError   = 2 // bad usage, or the cluster could not be asked at all
)

// verdict is the outcome of a check or of one of its findings, from best to worst.
type verdict string

const (
	verdictOK   verdict = "ok"
	verdictSkip verdict = "skip" // could not be checked; the summary says why
	verdictWarn verdict = "warn"
	verdictFail verdict = "fail"
)

func (v verdict) rank() int {
	switch v {
	case verdictSkip:
		return 1
	case verdictWarn:
		return 2
	case verdictFail:
		return 3
	}
	return 0
}

// doctorReport is what `kubescribe doctor --format json` prints.
type doctorReport struct {
	// Context is the kubeconfig context (or server) asked.
	Context string `json:"context"`
	// KubescribeNamespace is where kubescribe runs; Namespace the namespace whose objects were
	// checked ("" for all).
	KubescribeNamespace string         `json:"kubescribeNamespace"`
	Namespace           string         `json:"namespace,omitempty"`
	Checks              []*doctorCheck `json:"checks"`
	// Failed and Warnings count the checks with those verdicts.
	Failed   int `json:"failed"`
	Warnings int `json:"warnings"`
}

// doctorCheck is one check: a verdict, a one-line summary, what to do, and the findings
// behind it (one per object or per cause).
type doctorCheck struct {
	Name     string           `json:"name"`
	Title    string           `json:"title"`
	Verdict  verdict          `json:"verdict"`
	Summary  string           `json:"summary"`
	Fix      string           `json:"fix,omitempty"`
	Findings []*doctorFinding `json:"findings,omitempty"`
}

type doctorFinding struct {
	Verdict verdict `json:"verdict"`
	// Object is what the finding is about, "GitProvider team-a/repo"; empty for the check as
	// a whole.
	Object  string `json:"object,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

// add appends a finding and makes the check's verdict at least as bad as it.
func (c *doctorCheck) add(f *doctorFinding) {
	c.Findings = append(c.Findings, f)
	if f.Verdict.rank() > c.Verdict.rank() {
		c.Verdict = f.Verdict
	}
}

// doctorOptions are the flags of `kubescribe doctor`.
type doctorOptions struct {
	kubeconfig, context string
	// namespace limits the GitProviders, GitTargets and rules checked ("": all).
	namespace string
	// ksNamespace and deployment are where kubescribe runs.
	ksNamespace, deployment string
	// subjects is kubescribe's identity for the RBAC check; empty: the Deployment's
	// ServiceAccount.
	subjects []rbacv1.Subject
	// clusterName and attributionSource are kubescribe's --cluster-name and
	// --attribution-source; empty: read from the Deployment.
	clusterName, attributionSource string
	// opsURL and metricsURL reach kubescribe directly instead of through its Pods.
	opsURL, metricsURL string
	metricsCAFile      string
	metricsTokenFile   string
	// metricsSA is the ServiceAccount (NS/NAME) a short-lived token is requested for, to read
	// /metrics; empty: one bound to kubescribe-metrics-reader.
	metricsSA string
	auditWait time.Duration
	probe     bool
	format    string
}

func doctorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Everything doctor prints passes here: condition messages, Git and API errors and names
	// others chose reach the admin's terminal without a control character or escape sequence.
	stdout, stderr = safetext.NewWriter(stdout), safetext.NewWriter(stderr)
	o, err := parseDoctorFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitDoctorHealthy
		}
		fmt.Fprintln(stderr, "kubescribe doctor:", err)
		return exitDoctorError
	}
	cfg, contextName, err := restConfig(&exportOptions{kubeconfig: o.kubeconfig, context: o.context, qps: 50, burst: 100})
	if err != nil {
		fmt.Fprintln(stderr, "kubescribe doctor:", err)
		return exitDoctorError
	}
	cfg.UserAgent = "kubescribe-doctor"
	env, err := newDoctorEnv(o, cfg, contextName)
	if err != nil {
		fmt.Fprintln(stderr, "kubescribe doctor:", err)
		return exitDoctorError
	}
	report, err := env.run(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "kubescribe doctor:", err)
		return exitDoctorError
	}
	if err := writeDoctorReport(stdout, o.format, report); err != nil {
		fmt.Fprintln(stderr, "kubescribe doctor:", err)
		return exitDoctorError
	}
	if report.Failed > 0 {
		return exitDoctorFailed
	}
	return exitDoctorHealthy
}

func parseDoctorFlags(args []string, stderr io.Writer) (*doctorOptions, error) {
	o := &doctorOptions{}
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context to use (default: the current context)")
	fs.StringVar(&o.namespace, "namespace", "", "check only the GitProviders, GitTargets and WatchRules of this namespace, and the ClusterWatchRules writing into it (default: all)")
	fs.StringVar(&o.namespace, "n", "", "same as --namespace")
	fs.StringVar(&o.ksNamespace, "kubescribe-namespace", "kubescribe", "the namespace kubescribe runs in")
	fs.StringVar(&o.deployment, "deployment", "kubescribe", "kubescribe's Deployment")
	var groups listFlag
	sa := fs.String("service-account", "", "kubescribe's identity for the RBAC check, NAMESPACE/NAME (default: the Deployment's ServiceAccount)")
	user := fs.String("user", "", "kubescribe's identity for the RBAC check, a user (kubescribe run with a kubeconfig)")
	fs.Var(&groups, "group", "a group of --user; repeatable")
	fs.StringVar(&o.clusterName, "cluster-name", "", "kubescribe's --cluster-name, the local cluster's audit route (default: read from the Deployment, else local)")
	fs.StringVar(&o.attributionSource, "attribution-source", "", "kubescribe's --attribution-source, audit, admission or both (default: read from the Deployment, else audit)")
	fs.StringVar(&o.opsURL, "ops-url", "", "reach kubescribe's /healthz and /readyz here (http://HOST:PORT) instead of through its Pods")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "reach kubescribe's /metrics here (https://HOST:PORT/metrics) instead of through its Pods")
	fs.StringVar(&o.metricsCAFile, "metrics-ca-file", "", "PEM CA that signed the metrics listener's certificate (default: ca.crt of the Secret kubescribe serves, read through the API)")
	fs.StringVar(&o.metricsTokenFile, "metrics-token-file", "", "read /metrics with the bearer token in this file (default: a 10-minute token of --metrics-service-account)")
	fs.StringVar(&o.metricsSA, "metrics-service-account", "", "read /metrics with a 10-minute token of this ServiceAccount, NAMESPACE/NAME (default: one bound to kubescribe-metrics-reader)")
	fs.DurationVar(&o.auditWait, "audit-wait", 45*time.Second, "how long to wait for the apiserver to deliver an audit batch")
	noProbe := fs.Bool("no-probe", false, "make no dry-run write to provoke an audit event; only watch for deliveries")
	fs.StringVar(&o.format, "format", "text", "output format: text or json")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, fmt.Errorf("unexpected argument %q", pos[0])
	}
	o.probe = !*noProbe
	switch o.format {
	case "text", "json":
	default:
		return nil, fmt.Errorf("--format %q: want text or json", o.format)
	}
	switch o.attributionSource {
	case "", "audit", "admission", "both":
	default:
		return nil, fmt.Errorf("--attribution-source %q: want audit, admission or both", o.attributionSource)
	}
	if o.auditWait <= 0 {
		return nil, fmt.Errorf("--audit-wait %s: want a positive duration", o.auditWait)
	}
	if o.ksNamespace == "" || o.deployment == "" {
		return nil, errors.New("--kubescribe-namespace and --deployment must not be empty")
	}
	if o.metricsSA != "" {
		if ns, name, ok := strings.Cut(o.metricsSA, "/"); !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--metrics-service-account %q: want NAMESPACE/NAME", o.metricsSA)
		}
	}
	switch {
	case *sa != "" && *user != "":
		return nil, errors.New("give kubescribe's identity once: --service-account or --user")
	case *sa != "":
		ns, name, _ := strings.Cut(*sa, "/")
		if ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--service-account %q: want NAMESPACE/NAME", *sa)
		}
		o.subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}}
	case *user != "":
		o.subjects = []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: *user}}
		for _, g := range groups {
			o.subjects = append(o.subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: g})
		}
	case len(groups) > 0:
		return nil, errors.New("--group needs --user")
	}
	return o, nil
}

// doctorEnv is what the checks ask: the cluster through the user's kubeconfig, and
// kubescribe's processes through their ops and metrics listeners.
type doctorEnv struct {
	opts        *doctorOptions
	contextName string
	cfg         *rest.Config
	kube        kubernetes.Interface
	dyn         dynamic.Interface
	disc        discovery.DiscoveryInterface
	// forward reaches a port of a Pod (port-forwarding through the apiserver).
	forward podForwarder
	now     func() time.Time
	sleep   func(context.Context, time.Duration) error
}

func newDoctorEnv(o *doctorOptions, cfg *rest.Config, contextName string) (*doctorEnv, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return &doctorEnv{opts: o, contextName: contextName, cfg: cfg, kube: kube, dyn: dyn, disc: dc,
		forward: &apiPortForwarder{cfg: cfg, kube: kube}, now: time.Now, sleep: sleepContext}, nil
}

func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// run makes every check, in the order a new installation meets them.
func (e *doctorEnv) run(ctx context.Context) (*doctorReport, error) {
	objs, err := e.readObjects(ctx)
	if err != nil {
		return nil, err
	}
	ks := e.findKubescribe(ctx)
	defer ks.close()
	checks := []*doctorCheck{
		e.checkKubescribe(ctx, ks),
		e.checkRedis(ctx, ks),
	}
	audit := e.checkAuditDelivery(ctx, ks)
	checks = append(checks, audit,
		e.checkAuditRoutes(ks, objs),
		e.checkRBAC(ctx, ks, objs),
		e.checkRules(objs),
		e.checkGit(objs),
	)
	r := &doctorReport{Context: e.contextName, KubescribeNamespace: e.opts.ksNamespace, Namespace: e.opts.namespace, Checks: checks}
	for _, c := range checks {
		switch c.Verdict {
		case verdictFail:
			r.Failed++
		case verdictWarn:
			r.Warnings++
		}
	}
	return r, nil
}

func writeDoctorReport(w io.Writer, format string, r *doctorReport) error {
	r = r.stripped()
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	var b strings.Builder
	where := "every namespace"
	if r.Namespace != "" {
		where = "namespace " + r.Namespace
	}
	fmt.Fprintf(&b, "kubescribe doctor: %s, kubescribe in namespace %s, objects of %s\n\n", r.Context, r.KubescribeNamespace, where)
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-4s  %s: %s\n", strings.ToUpper(string(c.Verdict)), c.Title, c.Summary)
		for _, f := range c.Findings {
			if f.Verdict == verdictOK && c.Verdict != verdictOK {
				continue // the problems, not what is fine beside them
			}
			line := f.Message
			if f.Reason != "" {
				line = strings.TrimSuffix(f.Reason+": "+line, ": ")
			}
			if f.Object != "" {
				line = f.Object + ": " + line
			}
			fmt.Fprintf(&b, "      - %s\n", indentText(line, "        "))
			if f.Fix != "" {
				fmt.Fprintf(&b, "        fix: %s\n", indentText(f.Fix, "             "))
			}
		}
		if c.Fix != "" && c.Verdict != verdictOK {
			fmt.Fprintf(&b, "      fix: %s\n", indentText(c.Fix, "           "))
		}
	}
	switch {
	case r.Failed > 0:
		fmt.Fprintf(&b, "\n%s failed", plural(r.Failed, "check"))
		if r.Warnings > 0 {
			fmt.Fprintf(&b, ", %s", plural(r.Warnings, "warning"))
		}
		b.WriteString(".\n")
	case r.Warnings > 0:
		fmt.Fprintf(&b, "\nNothing failed; %s.\n", plural(r.Warnings, "warning"))
	default:
		b.WriteString("\nNothing wrong found.\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// stripped is a copy of r whose texts are stripped of control characters and escape sequences
// (safetext): the JSON encoder would escape them (\u001b), and whoever reads the JSON would
// print them again.
func (r *doctorReport) stripped() *doctorReport {
	out := *r
	out.Context, out.KubescribeNamespace, out.Namespace = safetext.Strip(r.Context), safetext.Strip(r.KubescribeNamespace), safetext.Strip(r.Namespace)
	out.Checks = make([]*doctorCheck, len(r.Checks))
	for i, c := range r.Checks {
		cc := *c
		cc.Name, cc.Title, cc.Summary, cc.Fix = safetext.Strip(c.Name), safetext.Strip(c.Title), safetext.Strip(c.Summary), safetext.Strip(c.Fix)
		if c.Findings != nil {
			cc.Findings = make([]*doctorFinding, len(c.Findings))
		}
		for j, f := range c.Findings {
			cc.Findings[j] = &doctorFinding{Verdict: f.Verdict, Object: safetext.Strip(f.Object),
				Reason: safetext.Strip(f.Reason), Message: safetext.Strip(f.Message), Fix: safetext.Strip(f.Fix)}
		}
		out.Checks[i] = &cc
	}
	return &out
}

// indentText indents the lines after the first of s.
func indentText(s, indent string) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+indent)
}
