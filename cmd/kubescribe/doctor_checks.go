package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// doctorObjects are kubescribe's objects: all of them (for routes), and those in the checked
// namespace.
type doctorObjects struct {
	all, scope rbacInput
	// crdsMissing: the cluster does not serve kubescribe.dev (the CRDs are not installed).
	crdsMissing bool
}

func (e *doctorEnv) readObjects(ctx context.Context) (*doctorObjects, error) {
	objs := &doctorObjects{}
	if err := objs.all.readCluster(ctx, e.dyn); err != nil {
		if apierrors.IsNotFound(err) {
			objs.crdsMissing = true
			return objs, nil
		}
		return nil, fmt.Errorf("reading kubescribe's objects from %s: %w", e.contextName, err)
	}
	ns := e.opts.namespace
	in := func(n string) bool { return ns == "" || n == ns }
	for _, r := range objs.all.watchRules {
		if in(r.Namespace) {
			objs.scope.watchRules = append(objs.scope.watchRules, r)
		}
	}
	for _, r := range objs.all.clusterWatchRules {
		if in(r.Spec.TargetRef.Namespace) {
			objs.scope.clusterWatchRules = append(objs.scope.clusterWatchRules, r)
		}
	}
	for _, p := range objs.all.providers {
		if in(p.Namespace) {
			objs.scope.providers = append(objs.scope.providers, p)
		}
	}
	for _, t := range objs.all.targets {
		if in(t.Namespace) {
			objs.scope.targets = append(objs.scope.targets, t)
		}
	}
	return objs, nil
}

// clusterName is kubescribe's --cluster-name: the flag, else the Deployment's, else local.
func (e *doctorEnv) clusterName(k *kubescribeProcs) string {
	if e.opts.clusterName != "" {
		return e.opts.clusterName
	}
	if v, ok := argValue(k.args, "--cluster-name"); ok && v != "" {
		return v
	}
	return "local"
}

// attributionSource is kubescribe's --attribution-source, likewise.
func (e *doctorEnv) attributionSource(k *kubescribeProcs) string {
	if e.opts.attributionSource != "" {
		return e.opts.attributionSource
	}
	if v, ok := argValue(k.args, "--attribution-source"); ok && v != "" {
		return v
	}
	return "audit"
}

// checkKubescribe: kubescribe runs, once, and is ready (or not, for a reason doctor names).
func (e *doctorEnv) checkKubescribe(ctx context.Context, k *kubescribeProcs) *doctorCheck {
	c := &doctorCheck{Name: "kubescribe", Title: "kubescribe runs", Verdict: verdictOK}
	if k.deployment == nil && len(k.instances) == 0 {
		c.Verdict, c.Summary = verdictFail, k.notFound
		c.Fix = "install it (kubectl apply -k deploy/overlays/quickstart, docs/install.md), or name it: --kubescribe-namespace, --deployment; " +
			"for a kubescribe outside the cluster, --ops-url and --metrics-url"
		return c
	}
	if k.deployment != nil {
		dep := k.deployment
		if dep.Spec.Replicas != nil && *dep.Spec.Replicas == 0 {
			c.Verdict, c.Summary = verdictFail, fmt.Sprintf("Deployment %s/%s is scaled to 0 replicas", dep.Namespace, dep.Name)
			c.Fix = fmt.Sprintf("kubectl -n %s scale deployment %s --replicas=2", dep.Namespace, dep.Name)
			return c
		}
		if len(k.pods) == 0 {
			c.Verdict, c.Summary = verdictFail, fmt.Sprintf("Deployment %s/%s has no Pod", dep.Namespace, dep.Name)
			for _, cond := range dep.Status.Conditions {
				if cond.Status == corev1.ConditionFalse || cond.Type == "ReplicaFailure" {
					c.add(&doctorFinding{Verdict: verdictFail, Object: "Deployment " + dep.Name, Reason: cond.Reason, Message: cond.Message})
				}
			}
			c.Fix = fmt.Sprintf("kubectl -n %s describe deployment %s; kubectl -n %s get events", dep.Namespace, dep.Name, dep.Namespace)
			return c
		}
		if dep.Spec.Replicas != nil && *dep.Spec.Replicas == 1 {
			c.add(&doctorFinding{Verdict: verdictWarn, Object: "Deployment " + dep.Name,
				Message: "1 replica: a rollout, a drain or a crash leaves the apiserver without an audit endpoint; it retries a batch for about 80s, then drops it, and the changes it explains lose their authors",
				Fix:     fmt.Sprintf("kubectl -n %s scale deployment %s --replicas=2 (docs/operations.md#replicas-and-handovers)", dep.Namespace, dep.Name)})
		}
		for i := range k.pods {
			p := &k.pods[i]
			reason, msg := podProblem(p)
			if reason == "" {
				continue
			}
			f := &doctorFinding{Verdict: verdictFail, Object: "Pod " + p.Name, Reason: reason, Message: msg}
			switch reason {
			case "CrashLoopBackOff", "Error":
				if line := e.lastLogLine(ctx, p, true, ""); line != "" {
					f.Message = strings.TrimSpace(f.Message + "; its last words: " + line)
				}
				f.Fix = fmt.Sprintf("kubectl -n %s logs %s --previous", p.Namespace, p.Name)
			case "ImagePullBackOff", "ErrImagePull", "ErrImageNeverPull":
				f.Fix = "load the image into the node (make image, docs/install.md#loading-it-into-a-node) or name a registry's in your overlay"
			case "CreateContainerConfigError":
				f.Fix = "a Secret or ConfigMap the Pod mounts is missing: run deploy/secrets.sh for the overlay, apply it again"
			default:
				f.Fix = fmt.Sprintf("kubectl -n %s describe pod %s", p.Namespace, p.Name)
			}
			c.add(f)
		}
	}
	ready := 0
	for _, in := range k.instances {
		code, body, err := in.readyCode, in.readyBody, in.readyErr
		f := &doctorFinding{Verdict: verdictOK, Object: in.name}
		switch {
		case err != nil && in.pod != nil && podReady(in.pod):
			// doctor's way in failed (port-forward rights, a proxy), not kubescribe.
			f.Verdict, f.Message = verdictWarn, "Ready, but doctor cannot reach its ops listener (/readyz): "+err.Error()
			f.Fix = portForwardFix
			ready++
		case err != nil:
			f.Verdict, f.Message = verdictFail, "cannot reach its ops listener (/readyz): "+err.Error()
		case code == 200:
			f.Message, ready = "ready", ready+1
		case strings.HasPrefix(body, "redis:"):
			f.Verdict, f.Reason, f.Message = verdictWarn, "NotReady", body+" (see the Redis check)"
		case strings.HasPrefix(body, "not running"):
			f.Verdict, f.Reason, f.Message = verdictWarn, "NotReady", body
			f.Fix = "run doctor again in a moment"
		default:
			f.Verdict, f.Reason, f.Message = verdictFail, "NotReady", fmt.Sprintf("/readyz answers %d: %s", code, body)
			if strings.Contains(body, "caches not synced") {
				f.Fix = "kubescribe cannot list its own objects: check its log (client-go lines) and that the ClusterRole kubescribe is bound to its ServiceAccount"
			}
		}
		c.add(f)
	}
	count, prefix := pluralES(len(k.instances), "process"), ""
	if k.deployment != nil {
		count, prefix = plural(len(k.instances), "Pod"), fmt.Sprintf("Deployment %s/%s: ", k.deployment.Namespace, k.deployment.Name)
	}
	switch {
	case len(k.instances) == 0:
		c.Summary = prefix + "no Pod runs"
	case c.Verdict == verdictOK:
		c.Summary = fmt.Sprintf("%s%s, ready", prefix, count)
	default:
		c.Summary = fmt.Sprintf("%s%d of %s ready", prefix, ready, count)
	}
	return c
}

// checkRedis: Redis answers kubescribe, as its /readyz says, and why not, as its log says.
func (e *doctorEnv) checkRedis(ctx context.Context, k *kubescribeProcs) *doctorCheck {
	c := &doctorCheck{Name: "redis", Title: "Redis answers kubescribe", Verdict: verdictOK}
	asked, answering := 0, 0
	for _, in := range k.instances {
		code, body := in.readyCode, in.readyBody
		if in.readyErr != nil {
			// No /readyz: a Pod that is not Ready may say why in its log.
			if in.pod != nil && !podReady(in.pod) {
				if why := e.lastLogLine(ctx, in.pod, false, "redis"); why != "" {
					c.add(&doctorFinding{Verdict: verdictFail, Object: in.name, Reason: "NotReady", Message: "its last Redis log line: " + why, Fix: redisFix(why)})
					asked++
				}
			}
			continue
		}
		asked++
		if code == 200 || !strings.HasPrefix(body, "redis:") {
			answering++
			continue
		}
		f := &doctorFinding{Verdict: verdictFail, Object: in.name, Message: "/readyz: " + body}
		why := ""
		if in.pod != nil {
			why = e.lastLogLine(ctx, in.pod, false, "redis")
		}
		if why != "" {
			f.Message += "; its log: " + why
		}
		f.Fix = redisFix(why)
		c.add(f)
	}
	// The Redis of deploy/components/redis, when installed.
	if k.deployment != nil {
		if sts, err := e.kube.AppsV1().StatefulSets(e.opts.ksNamespace).Get(ctx, "kubescribe-redis", metav1.GetOptions{}); err == nil {
			want := int32(1)
			if sts.Spec.Replicas != nil {
				want = *sts.Spec.Replicas
			}
			if sts.Status.ReadyReplicas < want {
				f := &doctorFinding{Verdict: verdictFail, Object: "StatefulSet kubescribe-redis",
					Message: fmt.Sprintf("%d of %d Redis Pods ready", sts.Status.ReadyReplicas, want),
					Fix:     fmt.Sprintf("kubectl -n %s describe pod kubescribe-redis-0 (a PersistentVolumeClaim without a default StorageClass stays Pending)", e.opts.ksNamespace)}
				if p, err := e.kube.CoreV1().Pods(e.opts.ksNamespace).Get(ctx, "kubescribe-redis-0", metav1.GetOptions{}); err == nil {
					if reason, msg := podProblem(p); reason != "" {
						f.Reason, f.Message = reason, f.Message+": "+msg
					}
				}
				c.add(f)
			}
		}
	}
	switch {
	case c.Verdict != verdictOK:
		c.Summary = "kubescribe cannot use Redis: audit batches are answered 503 and authors of changes made meanwhile may be lost"
	case asked == 0:
		c.Verdict, c.Summary = verdictSkip, "no kubescribe process answered /readyz (see above)"
	default:
		c.Summary = fmt.Sprintf("Redis answers kubescribe's PING (/readyz of %s)", pluralES(answering, "process"))
	}
	return c
}

// redisFix says what to do about a Redis error kubescribe logged.
func redisFix(logged string) string {
	l := strings.ToLower(logged)
	switch {
	case strings.Contains(l, "noauth") || strings.Contains(l, "wrongpass") || strings.Contains(l, "invalid password") || strings.Contains(l, "invalid username-password"):
		return "kubescribe's --redis-password-file and Redis' password differ: with deploy/components/redis both come from the Secret kubescribe-redis; apply the overlay again so both restart with it"
	case strings.Contains(l, "no such host"):
		return "the Redis address does not resolve: the ConfigMap kubescribe, key redis-addr (kubescribe-redis:6379 for deploy/components/redis)"
	case strings.Contains(l, "connection refused") || strings.Contains(l, "i/o timeout") || strings.Contains(l, "timeout"):
		return "Redis does not run, or a NetworkPolicy blocks port 6379 between kubescribe and Redis: kubectl -n kubescribe get pods"
	}
	return "check that Redis runs and kubescribe reaches it (its log, component redis: kubectl -n kubescribe logs deploy/kubescribe)"
}

// auditCodeFix is what an audit webhook answer other than 200 means.
var auditCodeFix = map[string]string{
	"400": "the apiserver posted bodies that are not audit.k8s.io/v1 EventLists (kubescribe's log: `undecodable audit batch`)",
	"401": "the apiserver's audit webhook kubeconfig presents no credential kubescribe accepts: regenerate it with kubescribe audit-webhook-config from kubescribe's token file or client CA",
	"403": "the webhook's credential is not bound to the route in its URL (/audit/ROUTE): kubescribe's log names both (`audit credential not bound to the route`)",
	"404": "the webhook URL names no valid route: it must end in /audit/<route>",
	"405": "the webhook sends something other than POST",
	"413": "audit batches exceed --audit-max-body-bytes: raise it, or lower the apiserver's --audit-webhook-batch-max-size",
	"503": "kubescribe could not store the facts (Redis): see the Redis check; the apiserver retries these batches",
}

// checkAuditDelivery: the apiserver delivers audit batches, and kubescribe takes them. It reads
// the audit request counter, makes a dry-run write (audited like any write, never stored) and
// waits for the counter to move.
func (e *doctorEnv) checkAuditDelivery(ctx context.Context, k *kubescribeProcs) *doctorCheck {
	c := &doctorCheck{Name: "audit-delivery", Title: "The apiserver sends audit events", Verdict: verdictOK}
	if k.token == "" && k.tokenSource != "" {
		c.Verdict, c.Summary = verdictSkip, "cannot read kubescribe's /metrics: "+k.tokenSource
		c.Fix = "bind " + metricsReaderRole + " to a ServiceAccount (deploy/components/monitoring binds Prometheus'), or pass --metrics-token-file"
		return c
	}
	before, err := scrape(ctx, k)
	if err != nil {
		msg, fix := describeScrapeError(err, k)
		c.Verdict, c.Summary, c.Fix = verdictSkip, msg, fix
		return c
	}
	if e.attributionSource(k) == "admission" {
		n := before.sum("kubescribe_admission_attribution_requests_total", nil)
		c.Summary = fmt.Sprintf("kubescribe takes authors from the attribution webhook (--attribution-source=admission), not from audit events; it answered %s since it started", plural(int(n), "review"))
		if n == 0 {
			c.Verdict = verdictWarn
			c.Fix = "is the webhook registered? kubectl get validatingwebhookconfiguration kubescribe-attribution (docs/managed-clusters.md)"
		}
		return c
	}
	c.add(&doctorFinding{Verdict: verdictOK, Object: "/metrics", Message: fmt.Sprintf("read with %s; certificate %s", k.tokenSource, k.metricsCA)})
	uptime := uptimeOf(before, e.now())
	// noProbe says why no write provoked an audit event ("" when one did).
	noProbe := "--no-probe"
	if e.opts.probe {
		noProbe = e.probeWrite(ctx)
	}
	start := e.now()
	after := before
	for e.now().Sub(start) < e.opts.auditWait {
		if err := e.sleep(ctx, time.Second); err != nil {
			break
		}
		if s, err := scrape(ctx, k); err == nil {
			after = s
		}
		if after.sum("kubescribe_audit_requests_total", nil) > before.sum("kubescribe_audit_requests_total", nil) {
			break
		}
	}
	waited := e.now().Sub(start).Round(time.Second)
	delta := map[string]float64{}
	for code, v := range after.by("kubescribe_audit_requests_total", "code") {
		if d := v - before.by("kubescribe_audit_requests_total", "code")[code]; d > 0 {
			delta[code] = d
		}
	}
	var routes []string
	for route, v := range after.by("kubescribe_audit_handler_duration_seconds", "route") {
		if v > before.by("kubescribe_audit_handler_duration_seconds", "route")[route] {
			routes = append(routes, route)
		}
	}
	sort.Strings(routes)
	for _, code := range sortedKeys(delta) {
		if code == "200" {
			continue
		}
		c.add(&doctorFinding{Verdict: verdictFail, Reason: "HTTP " + code,
			Message: fmt.Sprintf("%s answered %s in the last %s", plural(int(delta[code]), "audit request"), code, waited), Fix: auditCodeFix[code]})
	}
	total := before.by("kubescribe_audit_requests_total", "code")
	switch {
	case delta["200"] > 0:
		c.Summary = fmt.Sprintf("the apiserver delivered %s within %s, answered 200", pluralES(int(delta["200"]), "audit batch"), waited)
		if len(routes) > 0 {
			c.Summary += " (route " + strings.Join(routes, ", ") + ")"
		}
	case len(delta) > 0:
		c.Summary = "the apiserver's audit requests reach kubescribe but are refused"
	default:
		sum := 0.0
		for _, v := range total {
			sum += v
		}
		since := fmt.Sprintf("it has received %s since it started %s ago", plural(int(sum), "audit request"), uptime)
		switch {
		case noProbe == "":
			c.Verdict = verdictFail
			c.Summary = fmt.Sprintf("no audit batch reached kubescribe within %s of a write (a dry-run create, never stored); %s", waited, since)
		case sum == 0 && uptime > 5*time.Minute:
			c.Verdict = verdictFail
			c.Summary = fmt.Sprintf("no audit batch reached kubescribe in %s (no write provoked one: %s); %s", waited, noProbe, since)
		default:
			c.Verdict = verdictWarn
			c.Summary = fmt.Sprintf("no audit batch reached kubescribe in %s, but no write provoked one (%s); %s", waited, noProbe, since)
		}
		c.Fix = "point the apiserver at kubescribe: --audit-policy-file (kubescribe audit-policy), --audit-webhook-config-file " +
			"(kubescribe audit-webhook-config, URL https://<an address of Service kubescribe-audit the control plane reaches>:8443/audit/" + e.clusterName(k) +
			") and --audit-webhook-batch-max-wait=1s (docs/install.md#the-apiserver); the apiserver logs `Error in audit plugin 'webhook'` when it cannot reach kubescribe"
		if sum > 0 {
			c.Fix += "; a longer --audit-webhook-batch-max-wait than --audit-wait also looks like this"
		}
	}
	// Answers other than 200 since kubescribe started, that did not recur now.
	for _, code := range sortedKeys(total) {
		if code == "200" || total[code] == 0 || delta[code] > 0 {
			continue
		}
		c.add(&doctorFinding{Verdict: verdictWarn, Reason: "HTTP " + code,
			Message: fmt.Sprintf("%s answered %s since kubescribe started %s ago (not in the last %s)", plural(int(total[code]), "audit request"), code, uptime, waited),
			Fix:     auditCodeFix[code]})
	}
	return c
}

// probeWrite makes a write the apiserver audits and nothing stores: a dry-run create of a
// ConfigMap in kubescribe's namespace. It returns "" when the apiserver answered it, else why
// not. A refused request counts: the apiserver audits a write before it authorizes or admits
// it, so its event is sent whatever the answer (kubescribe keeps no fact of it).
func (e *doctorEnv) probeWrite(ctx context.Context) string {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "kubescribe-doctor-", Namespace: e.opts.ksNamespace,
		Labels: map[string]string{"app.kubernetes.io/name": "kubescribe-doctor"}}}
	_, err := e.kube.CoreV1().ConfigMaps(e.opts.ksNamespace).Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	var status apierrors.APIStatus
	if err == nil || errors.As(err, &status) {
		return ""
	}
	return "the dry-run write did not reach the apiserver: " + err.Error()
}

func uptimeOf(m metricSet, now time.Time) time.Duration {
	newest := 0.0
	for _, s := range m["process_start_time_seconds"] {
		newest = math.Max(newest, s.value)
	}
	if newest == 0 {
		return 0
	}
	return now.Sub(time.Unix(int64(newest), 0)).Round(time.Second)
}

func sortedKeys(m map[string]float64) []string { return slices.Sorted(maps.Keys(m)) }

// checkAuditRoutes: every remote source cluster's route delivers, and every route that
// delivers is one a GitTarget mirrors.
func (e *doctorEnv) checkAuditRoutes(k *kubescribeProcs, objs *doctorObjects) *doctorCheck {
	c := &doctorCheck{Name: "audit-routes", Title: "Every source cluster's audit route delivers", Verdict: verdictOK}
	local := e.clusterName(k)
	// The routes of the GitTargets checked, and of every GitTarget (a route another
	// namespace's targets mirror is not an unknown one).
	wanted, known := map[string][]string{}, map[string]bool{local: true}
	for _, t := range objs.all.targets {
		if t.Spec.SourceCluster != nil {
			known[t.Spec.SourceCluster.AuditRoute] = true
		}
	}
	for _, t := range objs.scope.targets {
		if t.Spec.SourceCluster != nil {
			r := t.Spec.SourceCluster.AuditRoute
			wanted[r] = append(wanted[r], t.Namespace+"/"+t.Name)
		}
	}
	m, err := scrape(context.Background(), k)
	if err != nil {
		msg, fix := describeScrapeError(err, k)
		if k.token == "" && k.tokenSource != "" {
			msg, fix = "cannot read kubescribe's /metrics: "+k.tokenSource, "see the audit check"
		}
		c.Verdict, c.Summary, c.Fix = verdictSkip, msg, fix
		return c
	}
	uptime := uptimeOf(m, e.now())
	delivered := m.by("kubescribe_audit_handler_duration_seconds", "route")
	for _, route := range slices.Sorted(maps.Keys(wanted)) {
		if delivered[route] > 0 {
			c.add(&doctorFinding{Verdict: verdictOK, Object: "route " + route, Message: fmt.Sprintf("%s since kubescribe started", pluralES(int(delivered[route]), "batch"))})
			continue
		}
		f := &doctorFinding{Verdict: verdictFail, Object: "route " + route,
			Message: fmt.Sprintf("GitTarget %s mirrors source cluster %q, but no audit batch came for route %s since kubescribe started %s ago: its changes are committed unresolved",
				strings.Join(wanted[route], ", "), route, route, uptime),
			Fix: "on that cluster's apiserver: --audit-webhook-config-file from kubescribe audit-webhook-config --url https://…:8443/audit/" + route +
				", with a credential bound to " + route + " (a line `<token> " + route + "` of --audit-token-file, or --audit-client-cert-routes CN=" + route + ")"}
		if uptime < 5*time.Minute {
			f.Verdict, f.Message = verdictWarn, f.Message+" (a quiet cluster may not have written yet)"
		}
		c.add(f)
	}
	for _, route := range sortedKeys(delivered) {
		if delivered[route] == 0 || known[route] {
			continue
		}
		c.add(&doctorFinding{Verdict: verdictWarn, Object: "route " + route,
			Message: fmt.Sprintf("%s came for route %s, but no GitTarget mirrors a source cluster of that route: they attribute nothing", pluralES(int(delivered[route]), "audit batch"), route),
			Fix:     "set spec.sourceCluster.auditRoute: " + route + " on that cluster's GitTargets, or fix the route at the end of its apiserver's webhook URL"})
	}
	if n := m.sum("kubescribe_audit_refused_total", map[string]string{"reason": "route_not_bound"}); n > 0 {
		c.add(&doctorFinding{Verdict: verdictWarn, Reason: "route_not_bound",
			Message: fmt.Sprintf("%s refused since kubescribe started: a valid credential posted for a route it is not bound to", plural(int(n), "audit request")),
			Fix:     "kubescribe's log names the route and the credential (`audit credential not bound to the route`): fix the webhook URL or the binding"})
	}
	switch {
	case c.Verdict != verdictOK:
		c.Summary = "a source cluster's audit events do not arrive under the route its GitTargets name"
	case len(wanted) == 0:
		c.Summary = fmt.Sprintf("no GitTarget mirrors a remote cluster; the local cluster's route is %s (the audit check above)", local)
	default:
		c.Summary = "the routes of the remote source clusters deliver: " + strings.Join(slices.Sorted(maps.Keys(wanted)), ", ")
	}
	return c
}

// checkRBAC: kubescribe's identity may list and watch what the rules select and get the
// Secrets GitProviders and GitTargets name (the grant `kubescribe rbac` prints, asked with
// SubjectAccessReviews), and no rule reports a watch the apiserver forbids.
func (e *doctorEnv) checkRBAC(ctx context.Context, k *kubescribeProcs, objs *doctorObjects) *doctorCheck {
	c := &doctorCheck{Name: "rbac", Title: "kubescribe may read what the rules select", Verdict: verdictOK,
		Fix: "grant what the rules need: kubescribe rbac | kubectl apply -f - (docs/cli.md#kubescribe-rbac)"}
	if objs.crdsMissing {
		c.Verdict, c.Summary = verdictSkip, "kubescribe's CRDs are not installed"
		return c
	}
	who, user, groups := e.identity(k)
	catalog, err := watch.NewCatalog(ctx, e.disc)
	if err != nil {
		c.Verdict, c.Summary = verdictSkip, "cannot read the cluster's API discovery: "+err.Error()
		return c
	}
	plan, _ := planRBAC(catalog, &objs.scope, "")
	asked, missing := 0, map[string]bool{} // missing: the scopes' "why" lines with a grant missing
	var sarErr error
	for _, ns := range slices.Sorted(maps.Keys(plan.scopes)) {
		s := plan.scopes[ns]
		where := "in namespace " + ns
		if ns == "" {
			where = "cluster-wide"
		}
		// GitProviders and GitTargets need the Secrets.
		var owners []string
		for _, w := range s.why {
			if strings.HasPrefix(w, "GitProvider ") || strings.HasPrefix(w, "GitTarget ") {
				owners = append(owners, w)
			}
		}
		for _, group := range slices.Sorted(maps.Keys(s.resources)) {
			for _, res := range slices.Sorted(slices.Values(s.resources[group])) {
				var lacking []string
				for _, verb := range []string{"list", "watch"} {
					ok, err := e.allowed(ctx, user, groups, authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: res})
					if err != nil {
						sarErr = err
						continue
					}
					asked++
					if !ok {
						lacking = append(lacking, verb)
					}
				}
				if len(lacking) == 0 {
					continue
				}
				rules := rulesSelecting(catalog, &objs.scope, ns, group, res)
				for _, r := range rules {
					missing[r] = true
				}
				c.add(&doctorFinding{Verdict: verdictFail, Message: fmt.Sprintf("%s may not %s %s %s, which %s", who, strings.Join(lacking, ", "),
					qualified(group, res), where, needs(rules))})
			}
		}
		var lackingSecrets []string
		for _, name := range slices.Sorted(slices.Values(s.secrets)) {
			ok, err := e.allowed(ctx, user, groups, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "secrets", Name: name})
			if err != nil {
				sarErr = err
				continue
			}
			asked++
			if !ok {
				lackingSecrets = append(lackingSecrets, name)
			}
		}
		if len(lackingSecrets) > 0 {
			c.add(&doctorFinding{Verdict: verdictFail, Message: fmt.Sprintf("%s may not get secret %s %s, which %s", who, strings.Join(lackingSecrets, ", "), where, needs(owners))})
		}
	}
	// What the rules themselves report: a watch the apiserver refused (on a remote cluster
	// too, where no review can be asked from here).
	report := func(kind, ns, name string, status *[]metav1.Condition) {
		ready := meta.FindStatusCondition(*status, v1alpha1.ConditionReady)
		if ready == nil || ready.Reason != v1alpha1.ReasonWatchFailed || !isForbidden(ready.Message) {
			return
		}
		id := kind + " " + name
		if ns != "" {
			id = kind + " " + ns + "/" + name
		}
		for w := range missing {
			if w == id || strings.HasPrefix(w, id+" (") {
				return // said above
			}
		}
		c.add(&doctorFinding{Verdict: verdictFail, Object: id, Reason: ready.Reason, Message: ready.Message,
			Fix: "on a remote source cluster: kubescribe rbac --source-cluster ROUTE -f RULES --kubeconfig REMOTE | kubectl --kubeconfig REMOTE apply -f -"})
	}
	for i := range objs.scope.watchRules {
		r := &objs.scope.watchRules[i]
		report("WatchRule", r.Namespace, r.Name, &r.Status.Conditions)
	}
	for i := range objs.scope.clusterWatchRules {
		r := &objs.scope.clusterWatchRules[i]
		report("ClusterWatchRule", "", r.Name, &r.Status.Conditions)
	}
	switch {
	case c.Verdict != verdictOK:
		c.Summary = who + " lacks grants the rules need: their watches fail"
	case sarErr != nil && asked == 0:
		c.Verdict, c.Summary, c.Fix = verdictSkip, "cannot ask the apiserver what "+who+" may do: "+sarErr.Error(), "run doctor as a user who may create SubjectAccessReviews"
	case asked == 0:
		c.Summary = "no rule selects a resource, and no GitProvider or GitTarget names a Secret"
	default:
		c.Summary = fmt.Sprintf("%s may do the %s the rules and Git credentials need", who, plural(asked, "request"))
	}
	return c
}

// pluralES is plural for the nouns that take -es.
func pluralES(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ses", n, noun)
}

// needs is "X needs" or "X, Y need".
func needs(who []string) string {
	if len(who) == 1 {
		return who[0] + " needs"
	}
	return strings.Join(who, ", ") + " need"
}

// rulesSelecting names the rules of in that make kubescribe read resource of group in
// namespace ns ("" cluster-wide), scoped as planRBAC scopes them: a WatchRule in its own
// namespace, a ClusterWatchRule cluster-wide or in its spec.namespaces; rules of GitTargets
// mirroring a remote cluster read nothing here.
func rulesSelecting(catalog *watch.Catalog, in *rbacInput, ns, group, resource string) []string {
	remote := map[string]bool{}
	for _, t := range in.targets {
		if t.Spec.SourceCluster != nil {
			remote[t.Namespace+"/"+t.Name] = true
		}
	}
	selects := func(rules []v1alpha1.ResourceRule, namespacedOnly bool) bool {
		sels := make([]watch.Selector, len(rules))
		for i, r := range rules {
			sels[i] = watch.Selector{APIGroups: r.APIGroups, APIVersions: r.APIVersions, Resources: r.Resources}
		}
		return slices.ContainsFunc(catalog.Resolve(sels, namespacedOnly).Resources, func(r watch.Resource) bool {
			return r.GVR.Group == group && r.GVR.Resource == resource
		})
	}
	var out []string
	for _, r := range in.watchRules {
		if r.Namespace == ns && !remote[r.Namespace+"/"+r.Spec.TargetRef.Name] && selects(r.Spec.Rules, true) {
			out = append(out, "WatchRule "+r.Namespace+"/"+r.Name)
		}
	}
	for _, r := range in.clusterWatchRules {
		inScope := ns == "" || slices.Contains(r.Spec.Namespaces, ns)
		if inScope && !remote[r.Spec.TargetRef.Namespace+"/"+r.Spec.TargetRef.Name] && selects(r.Spec.Rules, false) {
			out = append(out, "ClusterWatchRule "+r.Name)
		}
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func isForbidden(msg string) bool {
	return strings.Contains(msg, "forbidden") || strings.Contains(msg, "Forbidden")
}

func qualified(group, resource string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

// identity is kubescribe's identity: the flags, else the Deployment's ServiceAccount, else
// the default install's.
func (e *doctorEnv) identity(k *kubescribeProcs) (who, user string, groups []string) {
	subjects := e.opts.subjects
	if len(subjects) == 0 {
		sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: e.opts.ksNamespace, Name: "kubescribe"}
		if k.deployment != nil {
			sa.Name = firstNonEmpty(k.deployment.Spec.Template.Spec.ServiceAccountName, "default")
		}
		subjects = []rbacv1.Subject{sa}
	}
	s := subjects[0]
	if s.Kind == rbacv1.ServiceAccountKind {
		return fmt.Sprintf("ServiceAccount %s/%s", s.Namespace, s.Name), "system:serviceaccount:" + s.Namespace + ":" + s.Name,
			[]string{"system:serviceaccounts", "system:serviceaccounts:" + s.Namespace, "system:authenticated"}
	}
	groups = []string{"system:authenticated"}
	for _, g := range subjects[1:] {
		groups = append(groups, g.Name)
	}
	return "user " + s.Name, s.Name, groups
}

func (e *doctorEnv) allowed(ctx context.Context, user string, groups []string, attrs authorizationv1.ResourceAttributes) (bool, error) {
	sar, err := e.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &attrs}}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return sar.Status.Allowed, nil
}

// ruleFix is what to do for a rule's Ready reason (docs/operations.md, WatchRule and
// ClusterWatchRule).
var ruleFix = map[string]string{
	v1alpha1.ReasonTargetNotFound:     "create the GitTarget, or fix spec.targetRef",
	v1alpha1.ReasonTargetNotReady:     "see the GitTarget's reason (the Git check)",
	v1alpha1.ReasonNoResourcesMatched: "fix the resource names and groups, install the CRD, or check kubectl get apiservices",
	v1alpha1.ReasonPartiallyResolved:  "fix or remove the entries the message names; a CRD installed later is picked up by itself",
	v1alpha1.ReasonInvalidSpec:        "fix the spec the message names",
	v1alpha1.ReasonWatchFailed:        "check kubescribe's log (`watch failed`) and the API discovery of the source cluster",
}

// checkRules: every WatchRule and ClusterWatchRule watches (a watch RBAC forbids is the RBAC
// check's).
func (e *doctorEnv) checkRules(objs *doctorObjects) *doctorCheck {
	c := &doctorCheck{Name: "rules", Title: "WatchRules and ClusterWatchRules watch", Verdict: verdictOK}
	if objs.crdsMissing {
		c.Verdict, c.Summary, c.Fix = verdictFail, "kubescribe's CRDs are not installed (the cluster does not serve kubescribe.dev/v1alpha1)", "kubectl apply -k deploy/crds, or install an overlay"
		return c
	}
	n, ok := 0, 0
	check := func(id string, generation int64, st *[]metav1.Condition, observed int64) {
		n++
		f := conditionFinding(id, generation, st, observed)
		if f == nil {
			ok++
			return
		}
		if f.Reason == v1alpha1.ReasonWatchFailed && isForbidden(f.Message) {
			ok++ // the RBAC check's
			return
		}
		switch f.Reason {
		case v1alpha1.ReasonTargetNotReady, v1alpha1.ReasonPartiallyResolved, v1alpha1.ReasonProgressing:
			f.Verdict = verdictWarn
		}
		if f.Fix == "" {
			f.Fix = ruleFix[f.Reason]
		}
		c.add(f)
	}
	for i := range objs.scope.watchRules {
		r := &objs.scope.watchRules[i]
		check("WatchRule "+r.Namespace+"/"+r.Name, r.Generation, &r.Status.Conditions, r.Status.ObservedGeneration)
	}
	for i := range objs.scope.clusterWatchRules {
		r := &objs.scope.clusterWatchRules[i]
		check("ClusterWatchRule "+r.Name, r.Generation, &r.Status.Conditions, r.Status.ObservedGeneration)
	}
	switch {
	case n == 0:
		c.Verdict, c.Summary, c.Fix = verdictWarn, "no WatchRule or ClusterWatchRule: nothing is mirrored", "create one (deploy/examples/watchrule.yaml)"
	case c.Verdict == verdictOK:
		c.Summary = fmt.Sprintf("%s Ready", plural(n, "rule"))
	default:
		c.Summary = fmt.Sprintf("%d of %s Ready", ok, plural(n, "rule"))
	}
	return c
}

// conditionFinding is the finding of an object whose Ready condition is not True, or nil.
func conditionFinding(id string, generation int64, st *[]metav1.Condition, observed int64) *doctorFinding {
	ready := meta.FindStatusCondition(*st, v1alpha1.ConditionReady)
	switch {
	case ready == nil:
		return &doctorFinding{Verdict: verdictWarn, Object: id, Message: "no Ready condition yet: kubescribe has not reconciled it",
			Fix: "check that kubescribe runs (the first check)"}
	case observed < generation:
		return &doctorFinding{Verdict: verdictWarn, Object: id, Reason: ready.Reason,
			Message: fmt.Sprintf("its status describes generation %d, not %d: kubescribe has not reconciled the change yet", observed, generation),
			Fix:     "check that kubescribe runs (the first check)"}
	case ready.Status == metav1.ConditionTrue:
		return nil
	case ready.Status == metav1.ConditionUnknown:
		return &doctorFinding{Verdict: verdictWarn, Object: id, Reason: ready.Reason, Message: ready.Message}
	}
	return &doctorFinding{Verdict: verdictFail, Object: id, Reason: ready.Reason, Message: ready.Message}
}

// gitFix is what to do for a GitProvider's or GitTarget's Ready reason (docs/operations.md).
var gitFix = map[string]string{
	v1alpha1.ReasonInvalidSpec:               "use a plain URL and put the credentials in the Secret; fix the commit window",
	v1alpha1.ReasonSecretNotFound:            "create the Secret in the object's namespace; if it exists, grant kubescribe get on it: kubescribe rbac | kubectl apply -f -",
	v1alpha1.ReasonSecretInvalid:             "HTTPS: the token under password (and ca.crt a PEM CA); SSH: identity and known_hosts",
	v1alpha1.ReasonHostKeyRejected:           "compare the fingerprint with what your Git host publishes and fix known_hosts; if it should not have changed, suspect interception",
	v1alpha1.ReasonAuthenticationFailed:      "the repository refused the credentials: fix the token or its scopes (it needs push rights)",
	v1alpha1.ReasonSigningKeyInvalid:         "put a private key that signs under signing.key of the spec.signing Secret (its passphrase under signing.passphrase); until then commits are held or signed with the last key that signed",
	v1alpha1.ReasonRemoteUnreachable:         "check spec.url (the repository exists?), DNS and the network from kubescribe's Pod (the NetworkPolicy opens 443 and 22), and ca.crt for a private CA",
	v1alpha1.ReasonPushFailed:                "the remote refuses or does not take pushes: reachability, branch protection on the branch, push rights of the token",
	v1alpha1.ReasonProviderNotFound:          "create the GitProvider, or re-create the GitTarget with the right spec.providerRef (immutable)",
	v1alpha1.ReasonProviderNotReady:          "see the GitProvider's reason",
	v1alpha1.ReasonPathOverlap:               "give each GitTarget a folder of its own (spec.path), or another branch",
	v1alpha1.ReasonFolderNotAdoptable:        "run kubescribe scan on a checkout of the folder and fix what it reports, then push",
	v1alpha1.ReasonKubeConfigExecPlugin:      "use a token or client certificate in the kubeconfig, or run kubescribe with --allow-remote-kubeconfig-exec",
	v1alpha1.ReasonKubeConfigInsecure:        "set certificate-authority-data and use https://",
	v1alpha1.ReasonKubeConfigFileReference:   "put the kubeconfig's files inline (*-data, token)",
	v1alpha1.ReasonKubeConfigProxy:           "remove proxy-url; set HTTPS_PROXY on kubescribe's Deployment instead",
	v1alpha1.ReasonSourceClusterConflict:     "give each remote cluster a route of its own; the oldest GitTarget naming a route owns it",
	v1alpha1.ReasonSecretReferenceUnverified: "someone who may read the Secrets it names vouches for it: kubectl annotate <kind> <name> -n <namespace> kubescribe.dev/verify=$(date +%s) --overwrite (docs/security.md#secret-references)",
	v1alpha1.ReasonAuditRouteNotBound:        "the platform binds the route to this namespace with kubescribe's --audit-route-namespaces <route>=<namespace>, or use a route bound to it",
	v1alpha1.ReasonSourceClusterUnreachable:  "see the SourceClusterReachable condition: network and certificate, a rotated token, or deploy/source-cluster-rbac.yaml on the remote",
}

// checkGit: GitProviders reach their repositories with their credentials, and GitTargets
// push (or why not).
func (e *doctorEnv) checkGit(objs *doctorObjects) *doctorCheck {
	c := &doctorCheck{Name: "git", Title: "Git remotes take kubescribe's pushes", Verdict: verdictOK}
	if objs.crdsMissing {
		c.Verdict, c.Summary = verdictSkip, "kubescribe's CRDs are not installed"
		return c
	}
	providers, targets := len(objs.scope.providers), len(objs.scope.targets)
	if providers+targets == 0 {
		c.Verdict, c.Summary, c.Fix = verdictWarn, "no GitProvider or GitTarget: nothing is mirrored", "create them (deploy/examples)"
		return c
	}
	providersReady, targetsReady := 0, 0
	for i := range objs.scope.providers {
		p := &objs.scope.providers[i]
		if f := conditionFinding("GitProvider "+p.Namespace+"/"+p.Name, p.Generation, &p.Status.Conditions, p.Status.ObservedGeneration); f != nil {
			if f.Fix == "" {
				f.Fix = gitFix[f.Reason]
			}
			c.add(f)
			continue
		}
		providersReady++
	}
	for i := range objs.scope.targets {
		t := &objs.scope.targets[i]
		f := conditionFinding("GitTarget "+t.Namespace+"/"+t.Name, t.Generation, &t.Status.Conditions, t.Status.ObservedGeneration)
		if f == nil {
			targetsReady++
			continue
		}
		if f.Reason == v1alpha1.ReasonProviderNotReady {
			f.Verdict = verdictWarn // its provider's finding says why
		}
		if f.Fix == "" {
			f.Fix = gitFix[f.Reason]
		}
		c.add(f)
	}
	if c.Verdict == verdictOK {
		c.Summary = fmt.Sprintf("%s and %s Ready", plural(providers, "GitProvider"), plural(targets, "GitTarget"))
	} else {
		c.Summary = fmt.Sprintf("Ready: %d of %s, %d of %s", providersReady, plural(providers, "GitProvider"), targetsReady, plural(targets, "GitTarget"))
	}
	return c
}
