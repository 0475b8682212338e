package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// metricsReaderRole is deploy/base/rbac.yaml's ClusterRole that lets a scraper get /metrics.
const metricsReaderRole = "kubescribe-metrics-reader"

// portForwardFix is what to do when doctor cannot port-forward to kubescribe's Pod.
const portForwardFix = "doctor port-forwards to kubescribe's Pod: it needs create on pods/portforward in its namespace; " +
	"or run kubectl port-forward yourself and pass --ops-url and --metrics-url"

// metricsTokenTTL is how long the token doctor requests to read /metrics lives (the least
// the TokenRequest API issues).
const metricsTokenTTL = 10 * time.Minute

// kubescribeProcs is what doctor found of kubescribe: its Deployment and Pods (when it runs in
// the cluster) and the processes it could reach.
type kubescribeProcs struct {
	// deployment is nil when kubescribe runs outside the cluster (--ops-url, --metrics-url) or
	// was not found; notFound then says why.
	deployment *appsv1.Deployment
	notFound   string
	pods       []corev1.Pod
	// args are the kubescribe container's arguments, "--flag=value" (or "--flag", "value").
	args []string
	// instances are the processes reached.
	instances []*kubescribeInstance
	// token is the bearer token /metrics is read with; tokenSource says whose it is, or why
	// there is none (token empty).
	token, tokenSource string
	// metricsCA says how the metrics listener's certificate is verified.
	metricsCA string
	// metricsDisabled: the Deployment runs without a metrics listener.
	metricsDisabled bool
}

// kubescribeInstance is one kubescribe process: a Pod, or the URLs given.
type kubescribeInstance struct {
	name string
	pod  *corev1.Pod
	// opsURL is http://HOST:PORT; metricsURL https://HOST:PORT/metrics. Empty when not reached,
	// with the error in opsErr or metricsErr.
	opsURL, metricsURL string
	opsErr, metricsErr error
	metricsClient      *http.Client
	stops              []func()
	// The answer to GET /readyz: its code and body, or why there is none.
	readyCode int
	readyBody string
	readyErr  error
}

func (k *kubescribeProcs) close() {
	for _, in := range k.instances {
		for _, stop := range in.stops {
			stop()
		}
	}
}

// podForwarder makes a port of a Pod reachable at a local address.
type podForwarder interface {
	Forward(ctx context.Context, namespace, pod string, port int) (addr string, stop func(), err error)
}

// apiPortForwarder forwards through the apiserver's pods/portforward, as `kubectl
// port-forward` does: WebSockets first, SPDY from an apiserver that does not take them.
type apiPortForwarder struct {
	cfg  *rest.Config
	kube kubernetes.Interface
}

func (f *apiPortForwarder) Forward(ctx context.Context, namespace, pod string, port int) (string, func(), error) {
	rt, upgrader, err := spdy.RoundTripperFor(f.cfg)
	if err != nil {
		return "", nil, err
	}
	u := f.kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("portforward").URL()
	var dialer httpstream.Dialer = spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	if ws, err := portforward.NewSPDYOverWebsocketDialer(u, f.cfg); err == nil {
		dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	var errOut bytes.Buffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, &errOut)
	if err != nil {
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		if err == nil {
			err = errors.New(strings.TrimSpace(errOut.String()))
		}
		return "", nil, err
	case <-ctx.Done():
		close(stop)
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		close(stop)
		return "", nil, fmt.Errorf("port-forward to %s/%s:%d: no local port: %v", namespace, pod, port, err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local))), func() { close(stop); <-done }, nil
}

// findKubescribe finds kubescribe's processes and reaches their ops and metrics listeners:
// the URLs given, else every running Pod of the Deployment, port-forwarded.
func (e *doctorEnv) findKubescribe(ctx context.Context) *kubescribeProcs {
	o := e.opts
	k := &kubescribeProcs{}
	if o.opsURL != "" || o.metricsURL != "" {
		in := &kubescribeInstance{name: strings.TrimSuffix(firstNonEmpty(o.opsURL, o.metricsURL), "/metrics"), opsURL: strings.TrimRight(o.opsURL, "/")}
		if o.opsURL == "" {
			in.opsErr = errors.New("not reached: --metrics-url given without --ops-url")
		}
		if o.metricsURL == "" {
			in.metricsErr = errors.New("not reached: --ops-url given without --metrics-url")
		} else {
			in.metricsURL = o.metricsURL
		}
		k.instances = []*kubescribeInstance{in}
		k.notFound = "kubescribe was given by URL"
	} else {
		dep, err := e.kube.AppsV1().Deployments(o.ksNamespace).Get(ctx, o.deployment, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			k.notFound = fmt.Sprintf("no Deployment %s in namespace %s", o.deployment, o.ksNamespace)
			return k
		case err != nil:
			k.notFound = fmt.Sprintf("reading Deployment %s/%s: %v", o.ksNamespace, o.deployment, err)
			return k
		}
		k.deployment = dep
		if c := kubescribeContainer(&dep.Spec.Template.Spec); c != nil {
			k.args = c.Args
		}
		sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
		if err == nil {
			pods, err := e.kube.CoreV1().Pods(o.ksNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
			if err == nil {
				k.pods = pods.Items
				sort.Slice(k.pods, func(i, j int) bool { return k.pods[i].Name < k.pods[j].Name })
			}
		}
		if v, ok := argValue(k.args, "--metrics-listen-address"); ok && v == "" {
			k.metricsDisabled = true
		}
		for i := range k.pods {
			p := &k.pods[i]
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			k.instances = append(k.instances, e.reachPod(ctx, p, k.metricsDisabled))
		}
	}
	for _, in := range k.instances {
		in.readyCode, in.readyBody, in.readyErr = readyz(ctx, in)
	}
	e.metricsAccess(ctx, k)
	return k
}

// reachPod port-forwards the ops and metrics ports of a kubescribe Pod.
func (e *doctorEnv) reachPod(ctx context.Context, p *corev1.Pod, metricsDisabled bool) *kubescribeInstance {
	in := &kubescribeInstance{name: "Pod " + p.Name, pod: p}
	c := kubescribeContainer(&p.Spec)
	opsPort, metricsPort := 8080, 8081
	if c != nil {
		opsPort = containerPort(c, "health", "--ops-listen-address", opsPort)
		metricsPort = containerPort(c, "metrics", "--metrics-listen-address", metricsPort)
	}
	if addr, stop, err := e.forward.Forward(ctx, p.Namespace, p.Name, opsPort); err != nil {
		in.opsErr = fmt.Errorf("port-forward to %s:%d: %w", p.Name, opsPort, err)
	} else {
		in.opsURL, in.stops = "http://"+addr, append(in.stops, stop)
	}
	if metricsDisabled {
		in.metricsErr = errors.New("the Deployment disables the metrics listener (--metrics-listen-address=)")
		return in
	}
	if addr, stop, err := e.forward.Forward(ctx, p.Namespace, p.Name, metricsPort); err != nil {
		in.metricsErr = fmt.Errorf("port-forward to %s:%d: %w", p.Name, metricsPort, err)
	} else {
		in.metricsURL, in.stops = "https://"+addr+"/metrics", append(in.stops, stop)
	}
	return in
}

// metricsAccess decides how /metrics is read: the CA its certificate is verified with, and
// the token presented. The token is never the user's own credential unless they hand it over
// with --metrics-token-file: the metrics listener sends it to the apiserver for review, and an
// exec plugin's token (a cloud provider's) may be good for far more than this cluster. A
// ServiceAccount bound to kubescribe-metrics-reader (Prometheus') is what scrapers present;
// doctor requests a 10-minute token of it, which also proves that binding.
func (e *doctorEnv) metricsAccess(ctx context.Context, k *kubescribeProcs) {
	o := e.opts
	var pool *x509.CertPool
	switch {
	case o.metricsCAFile != "":
		b, err := os.ReadFile(o.metricsCAFile)
		if err == nil {
			pool = x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				err = errors.New("no PEM certificate in it")
			}
		}
		if err != nil {
			k.metricsCA = fmt.Sprintf("--metrics-ca-file %s: %v", o.metricsCAFile, err)
			pool = nil
		} else {
			k.metricsCA = "verified with --metrics-ca-file"
		}
	case k.deployment != nil:
		pool, k.metricsCA = e.servingCA(ctx, k.deployment)
	default:
		k.metricsCA = "verified with the system's roots"
	}
	serverName := ""
	if k.deployment != nil {
		serverName = "kubescribe-metrics." + o.ksNamespace + ".svc"
	}
	for _, in := range k.instances {
		tc := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
		if pool == nil && k.deployment != nil {
			// Reached through the apiserver's port-forward to the Pod named: the tunnel, not
			// the certificate, says who answers. The token sent is a 10-minute reader's.
			tc.InsecureSkipVerify = true
		}
		in.metricsClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}

	switch {
	case o.metricsTokenFile != "":
		b, err := os.ReadFile(o.metricsTokenFile)
		if err != nil {
			k.tokenSource = fmt.Sprintf("--metrics-token-file: %v", err)
			return
		}
		k.token, k.tokenSource = strings.TrimSpace(string(b)), "the token of --metrics-token-file"
		return
	case len(k.instances) == 0:
		return
	}
	ns, name, _ := strings.Cut(o.metricsSA, "/")
	if o.metricsSA == "" {
		var why string
		if ns, name, why = e.metricsReaderSA(ctx); name == "" {
			k.tokenSource = why
			return
		}
	}
	ttl := int64(metricsTokenTTL / time.Second)
	tok, err := e.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		k.tokenSource = fmt.Sprintf("requesting a token of ServiceAccount %s/%s: %v", ns, name, err)
		return
	}
	k.token, k.tokenSource = tok.Status.Token, fmt.Sprintf("a 10-minute token of ServiceAccount %s/%s", ns, name)
}

// metricsReaderSA is a ServiceAccount bound to kubescribe-metrics-reader (the first by name of
// the first binding by name), or why there is none.
func (e *doctorEnv) metricsReaderSA(ctx context.Context) (ns, name, why string) {
	list, err := e.kube.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", fmt.Sprintf("listing ClusterRoleBindings to find one of %s: %v", metricsReaderRole, err)
	}
	bindings := list.Items
	sort.Slice(bindings, func(i, j int) bool { return bindings[i].Name < bindings[j].Name })
	for _, b := range bindings {
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != metricsReaderRole {
			continue
		}
		for _, s := range b.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind {
				return s.Namespace, s.Name, ""
			}
		}
	}
	return "", "", "no ServiceAccount is bound to " + metricsReaderRole + " (Prometheus' would be)"
}

// servingCA is the CA in ca.crt of the Secret the Deployment serves its listeners' certificate
// from (its volume "tls", or the Secret of --tls-self-managed-secret), read with the user's
// rights.
func (e *doctorEnv) servingCA(ctx context.Context, dep *appsv1.Deployment) (*x509.CertPool, string) {
	namespace, secret := dep.Namespace, ""
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "tls" && v.Secret != nil {
			secret = v.Secret.SecretName
		}
	}
	if c := kubescribeContainer(&dep.Spec.Template.Spec); c != nil {
		for _, a := range c.Args {
			if ref, ok := strings.CutPrefix(a, "--tls-self-managed-secret="); ok {
				if ns, name, ok := strings.Cut(ref, "/"); ok {
					namespace, secret = ns, name
				}
			}
		}
	}
	if secret == "" {
		return nil, "not verified: the Deployment mounts no Secret as volume tls and names no --tls-self-managed-secret (pass --metrics-ca-file)"
	}
	s, err := e.kube.CoreV1().Secrets(namespace).Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Sprintf("not verified: reading Secret %s/%s: %v (pass --metrics-ca-file)", namespace, secret, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
		return nil, fmt.Sprintf("not verified: Secret %s/%s holds no ca.crt (pass --metrics-ca-file)", namespace, secret)
	}
	return pool, fmt.Sprintf("verified with ca.crt of Secret %s/%s", namespace, secret)
}

func kubescribeContainer(spec *corev1.PodSpec) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == "kubescribe" {
			return &spec.Containers[i]
		}
	}
	if len(spec.Containers) == 1 {
		return &spec.Containers[0]
	}
	return nil
}

// containerPort is the container's port of that name, else the port of the listen-address
// flag, else def.
func containerPort(c *corev1.Container, name, flag string, def int) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	if v, ok := argValue(c.Args, flag); ok {
		if _, port, err := net.SplitHostPort(v); err == nil {
			if n, err := strconv.Atoi(port); err == nil {
				return n
			}
		}
	}
	return def
}

// argValue is the value of flag in args, given as "--flag=value" or "--flag value" (the last
// one wins, as the flag package does).
func argValue(args []string, flag string) (string, bool) {
	value, found := "", false
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, flag+"="):
			value, found = strings.TrimPrefix(a, flag+"="), true
		case a == flag && i+1 < len(args):
			value, found = args[i+1], true
		}
	}
	return value, found
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// readyz is an instance's answer to GET /readyz: its code and body, or why there is none.
func readyz(ctx context.Context, in *kubescribeInstance) (int, string, error) {
	if in.opsURL == "" {
		return 0, "", in.opsErr
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.opsURL+"/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// metricSet is a scrape of /metrics: the samples of each family, by name.
type metricSet map[string][]metricSample

type metricSample struct {
	labels map[string]string
	value  float64
}

// sum adds the samples of name whose labels include match.
func (m metricSet) sum(name string, match map[string]string) float64 {
	total := 0.0
	for _, s := range m[name] {
		if hasAll(s.labels, match) {
			total += s.value
		}
	}
	return total
}

// by adds the samples of name by the value of label.
func (m metricSet) by(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m[name] {
		out[s.labels[label]] += s.value
	}
	return out
}

func hasAll(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// scrapeError is a /metrics answer other than 200.
type scrapeError struct {
	code int
	body string
}

func (e *scrapeError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.code, e.body) }

// scrape reads every reachable instance's /metrics into one set (the samples of all of them:
// sums add the processes up). It fails when no instance could be read.
func scrape(ctx context.Context, k *kubescribeProcs) (metricSet, error) {
	set := metricSet{}
	var errs []error
	read := 0
	for _, in := range k.instances {
		if in.metricsURL == "" {
			errs = append(errs, fmt.Errorf("%s: %w", in.name, in.metricsErr))
			continue
		}
		if err := scrapeOne(ctx, in, k.token, set); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", in.name, err))
			continue
		}
		read++
	}
	if read == 0 {
		if len(errs) == 0 {
			return nil, errors.New("no running kubescribe to read")
		}
		return nil, errors.Join(errs...)
	}
	return set, nil
}

func scrapeOne(ctx context.Context, in *kubescribeInstance, token string, set metricSet) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.metricsURL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := in.metricsClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &scrapeError{code: resp.StatusCode, body: strings.TrimSpace(string(b))}
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the page: %w", err)
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			set[name] = append(set[name], metricSample{labels: labels, value: sampleValue(f.GetType(), m)})
		}
	}
	return nil
}

// sampleValue is a sample's value; for a histogram, its count (the _count series).
func sampleValue(t dto.MetricType, m *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	case dto.MetricType_SUMMARY:
		return float64(m.GetSummary().GetSampleCount())
	}
	return m.GetUntyped().GetValue()
}

// describeScrapeError says what a failed read of /metrics means, and what to do.
func describeScrapeError(err error, k *kubescribeProcs) (string, string) {
	var se *scrapeError
	if errors.As(err, &se) {
		switch se.code {
		case http.StatusUnauthorized:
			return fmt.Sprintf("the metrics listener did not accept %s (401)", k.tokenSource),
				"pass --metrics-token-file with a token the apiserver accepts, or --metrics-service-account"
		case http.StatusForbidden:
			return fmt.Sprintf("%s may not get /metrics (403)", k.tokenSource),
				"bind the ClusterRole " + metricsReaderRole + " to that ServiceAccount (deploy/components/monitoring binds Prometheus')"
		}
	}
	if strings.Contains(err.Error(), "port-forward") {
		return "cannot read /metrics: " + err.Error(), portForwardFix
	}
	return "cannot read /metrics: " + err.Error(), "check that kubescribe runs and its metrics listener is enabled (--metrics-listen-address)"
}

// lastLogLine is the last line of a container's log (the previous instance's when previous)
// that is at level WARN or ERROR and, when component is set, of that component, as
// "msg: err"; or "".
func (e *doctorEnv) lastLogLine(ctx context.Context, pod *corev1.Pod, previous bool, component string) string {
	c := kubescribeContainer(&pod.Spec)
	if c == nil {
		return ""
	}
	tail := int64(300)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := e.kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: &tail, Previous: previous}).DoRaw(ctx)
	if err != nil {
		return ""
	}
	return lastLogRecord(b, component)
}

// lastLogRecord is the last WARN or ERROR record of kubescribe's JSON log b (of component,
// when set), as "msg: err"; without a component, a last line that is not JSON counts too (a
// text log, or the runtime's own output on a crash).
func lastLogRecord(b []byte, component string) string {
	last := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			if component == "" && strings.TrimSpace(sc.Text()) != "" {
				last = sc.Text()
			}
			continue
		}
		level, _ := rec["level"].(string)
		if level != "WARN" && level != "ERROR" {
			continue
		}
		if c, _ := rec["component"].(string); component != "" && c != component {
			continue
		}
		msg, _ := rec["msg"].(string)
		if errText, ok := rec["err"].(string); ok && errText != "" {
			msg += ": " + errText
		}
		last = msg
	}
	return last
}

// podProblem says what keeps a Pod from running, from its status, or "".
func podProblem(p *corev1.Pod) (reason, message string) {
	if p.Status.Phase == corev1.PodPending {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return c.Reason, c.Message
			}
		}
	}
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			msg := w.Message
			if t := cs.LastTerminationState.Terminated; t != nil {
				msg = strings.TrimSpace(fmt.Sprintf("%s (last exit: code %d, %s)", msg, t.ExitCode, firstNonEmpty(strings.TrimSpace(t.Message), t.Reason)))
			}
			return w.Reason, msg
		}
	}
	if p.Status.Phase == corev1.PodFailed {
		return "Failed", p.Status.Message
	}
	return "", ""
}
