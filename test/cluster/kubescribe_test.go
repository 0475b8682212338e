package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/cluster"
	"github.com/kubescribe/kubescribe/test/controlplane"
	"github.com/kubescribe/kubescribe/test/stack"
)

// The user's side of the README's quickstart, on the node: what the steps after `kubectl
// apply -k` do, with the CLI built from this checkout, the files it prints handed to the
// apiserver, and deploy/examples applied with the test's Git server as the GitProvider's url.

// user is what the steps share: the copy of deploy/ the overlays were built in (its secrets/
// folders are the user's), the CLI, and the Git server the GitProvider points at.
type user struct {
	c       *cluster.Cluster
	dir     string
	cli     string
	git     *controlplane.GitServer
	repoDir string
	// age is the identity Secrets are encrypted for, once a step made it.
	age *age.X25519Identity
}

// examplesPath is deploy/examples/gittarget.yaml's folder in the repository.
const examplesPath = "clusters/example"

// newUser builds the CLI (cmd/kubescribe) into dir, and starts the Git server on the node's
// bridge (where Pods reach it) with an empty repository platform/cluster-config; it stops
// when t ends.
func newUser(t *testing.T, c *cluster.Cluster, dir string) *user {
	t.Helper()
	root, err := cluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(dir, "kubescribe")
	cmd := exec.Command("go", "build", "-o", cli, "./cmd/kubescribe")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kubescribe: %v\n%s", err, out)
	}
	u := &user{c: c, dir: dir, cli: cli}
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	u.git, err = controlplane.StartGitServer(gitPath, filepath.Join(dir, "git"), filepath.Join(dir, "git.log"), c.CA, net.ParseIP(cluster.NodeIP))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.git.Stop)
	if u.repoDir, err = u.git.CreateRepo("platform/cluster-config"); err != nil {
		t.Fatal(err)
	}
	return u
}

// run runs the CLI with the admin's kubeconfig and returns its standard output.
func (u *user) run(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(u.cli, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+u.c.KubeconfigPath("admin"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubescribe %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// secret is the path of a file deploy/secrets.sh wrote for overlay.
func (u *user) secret(overlay, name string) string {
	return filepath.Join(u.dir, "deploy", "overlays", overlay, "secrets", name)
}

// wireAPIServer is the README's steps 3 and 4: the audit policy, the audit webhook kubeconfig
// for the Service kubescribe-audit's cluster IP with the Service's name as the server name and
// the CA read from the Secret kubescribe-tls, the admission credential, and the apiserver
// restarted with them (--audit-webhook-batch-max-wait=1s, the retry schedule its default).
func wireAPIServer(ctx context.Context, t *testing.T, u *user) {
	svc, err := u.c.Client.CoreV1().Services("kubescribe").Get(ctx, "kubescribe-audit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	policy := u.run(t, "audit-policy")
	webhook := u.run(t, "audit-webhook-config", "--url", "https://"+net.JoinHostPort(svc.Spec.ClusterIP, "8443")+"/audit/local",
		"--tls-server-name", "kubescribe-audit.kubescribe.svc", "--ca-from-secret", "kubescribe/kubescribe-tls",
		"--token-file", u.secret("quickstart", "audit-token"))
	admission := u.run(t, "admission-client-config", "--token-file", u.secret("quickstart", "admission-token"))
	began := time.Now()
	if err := u.c.SetAudit(ctx, &cluster.Audit{Policy: policy, WebhookKubeconfig: webhook, BatchMaxWait: time.Second, AdmissionKubeconfig: admission}); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver restarted with the audit webhook to %s:8443 and the admission credential in %s",
		svc.Spec.ClusterIP, time.Since(began).Round(100*time.Millisecond))
}

// mirror is the README's step 5 against a Git server on the node's bridge (where the Pod
// reaches it): deploy/examples' GitProvider, GitTarget and WatchRule (every ConfigMap of
// default), the credentials Secret, `kubescribe rbac | kubectl apply -f -`; then alice and
// bob write, and each change is committed authored by its writer.
func mirror(ctx context.Context, t *testing.T, u *user) {
	if _, err := u.c.Client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "example-git-credentials"},
		StringData: map[string]string{"username": u.git.Username, "password": u.git.Password, "ca.crt": string(u.git.CAData)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root, err := cluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var examples []byte
	for _, f := range []string{"gitprovider.yaml", "gittarget.yaml", "watchrule.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		examples = append(append(examples, "---\n"...), b...)
	}
	const placeholder = "https://git.example.com/platform/cluster-config.git"
	if !bytes.Contains(examples, []byte(placeholder)) {
		t.Fatalf("deploy/examples/gitprovider.yaml's url is no longer %s", placeholder)
	}
	examples = bytes.ReplaceAll(examples, []byte(placeholder), []byte(u.git.URL("platform/cluster-config")))
	if err := stack.Apply(ctx, u.c.AdminConfig, examples); err != nil {
		t.Fatal(err)
	}
	if err := stack.Apply(ctx, u.c.AdminConfig, u.run(t, "rbac")); err != nil {
		t.Fatal(err)
	}
	vouchFor(ctx, t, u.c, v1alpha1.GitProvidersResource, "example")
	waitReady(ctx, t, u.c, v1alpha1.GitTargetsResource, "example")
	waitReady(ctx, t, u.c, v1alpha1.WatchRulesResource, "configmaps")
	for _, name := range []string{"alice", "bob"} {
		if _, err := u.c.Client.RbacV1().RoleBindings("default").Create(ctx, roleBinding(name+"-edit", "edit", name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	alice, bob := clientFor(t, u.c, "alice"), clientFor(t, u.c, "bob")
	writeConfigMap(ctx, t, alice, "from-alice", "1")
	writeConfigMap(ctx, t, bob, "from-bob", "1")
	u.waitAuthors(ctx, t, 90*time.Second, map[string]string{"from-alice": "alice", "from-bob": "bob"})
	writeConfigMap(ctx, t, bob, "from-alice", "2")
	u.waitAuthors(ctx, t, 90*time.Second, map[string]string{"from-alice": "bob"})
	if err := alice.CoreV1().ConfigMaps("default").Delete(ctx, "from-bob", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitAuthors(ctx, t, 90*time.Second, map[string]string{"from-bob": "alice (deleted)"})
	t.Logf("commits:\n%s", u.gitLog(t))
}

// vouchFor waits until kubescribe uses the Secrets the object of default names. Applied by
// the admin through the webhook of Secret references, it is vouched for at once; written while
// the apiserver could not call the webhook yet, it is vouched for by the admin touching it, as
// docs/operations.md says for SecretReferenceUnverified.
func vouchFor(ctx context.Context, t *testing.T, c *cluster.Cluster, resource schema.GroupVersionResource, name string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	i := 0
	poll(ctx, t, 2*time.Minute, name+" vouched for", func() error {
		ready, reason := condition(ctx, c, resource, name)
		if ready || (reason != "no Ready condition" && !strings.HasPrefix(reason, v1alpha1.ReasonSecretReferenceUnverified)) {
			return nil
		}
		i++
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"kubescribe.dev/verify":"%d"}}}`, i)
		if _, err := dyn.Resource(resource).Namespace("default").Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return err
		}
		return fmt.Errorf("%s is SecretReferenceUnverified", name)
	})
}

// rolloutRestart is `kubectl rollout restart deployment/kubescribe` while alice and bob keep
// writing: the two replicas are replaced one at a time, a Ready one serving the audit
// endpoint throughout, and every change made before, during and after the rollout is
// committed, authored by its writer.
func rolloutRestart(ctx context.Context, t *testing.T, u *user) {
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := u.c.Client.AppsV1().Deployments("kubescribe").Patch(ctx, "kubescribe", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	alice, bob := clientFor(t, u.c, "alice"), clientFor(t, u.c, "bob")
	want := map[string]string{}
	write := func(i int, phase string) {
		a, b := fmt.Sprintf("restart-alice-%d", i), fmt.Sprintf("restart-bob-%d", i)
		writeConfigMap(ctx, t, alice, a, phase)
		writeConfigMap(ctx, t, bob, b, phase)
		want[a], want[b] = "alice", "bob"
	}
	// Two writers, a pair of writes every half second, until the rollout is done: some land
	// while an old Pod drains, some while a new one starts.
	began, downtime := time.Now(), 0
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		if readyPods(ctx, u.c) == 0 {
			downtime++
		}
		write(i, "during")
		if done, _ := rolledOut(ctx, u.c); done {
			break
		}
		if time.Since(began) > 4*time.Minute {
			t.Fatalf("kubescribe not rolled out 4m after the restart")
		}
		<-tick.C
	}
	t.Logf("rolled out in %s; %d writes, %d pairs while no kubescribe Pod was Ready", time.Since(began).Round(100*time.Millisecond), len(want), downtime)
	if downtime > 0 {
		t.Errorf("no kubescribe Pod was Ready during %d pairs of writes: the audit endpoint went away", downtime)
	}
	writeConfigMap(ctx, t, alice, "restart-alice-after", "after")
	writeConfigMap(ctx, t, bob, "restart-bob-after", "after")
	want["restart-alice-after"], want["restart-bob-after"] = "alice", "bob"
	// A branch moves twice per replaced Pod (to the other replica, then to the new Pod when it
	// ranks first); its new owner resumes from the cursors.
	u.waitAuthors(ctx, t, 4*time.Minute, want)
	t.Logf("every change of the rollout committed by its writer %s after the restart", time.Since(began).Round(100*time.Millisecond))
}

// commitRequest is the README's step 7: alice, granted kubescribe-commit-requester, changes a
// ConfigMap and closes her window with a message.
func commitRequest(ctx context.Context, t *testing.T, u *user) {
	if _, err := u.c.Client.RbacV1().RoleBindings("default").Create(ctx, roleBinding("alice-commits", "kubescribe-commit-requester", "alice"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writeConfigMap(ctx, t, clientFor(t, u.c, "alice"), "feature-flags", "on")
	dyn, err := dynamic.NewForConfig(u.c.UserConfig("alice"))
	if err != nil {
		t.Fatal(err)
	}
	cr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubescribe.dev/v1alpha1", "kind": "CommitRequest",
		"metadata": map[string]any{"name": "enable-checkout"},
		"spec": map[string]any{
			"targetRef": map[string]any{"name": "example"},
			"message":   "Enable the new checkout\n\nRollout plan in ticket 42.",
			// Lets the audit event of the change arrive first.
			"closeDelaySeconds": int64(5),
		},
	}}
	if _, err := dyn.Resource(v1alpha1.CommitRequestsResource).Namespace("default").Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var reason string
	poll(ctx, t, 90*time.Second, "CommitRequest enable-checkout Committed", func() error {
		var ready bool
		ready, reason = condition(ctx, u.c, v1alpha1.CommitRequestsResource, "enable-checkout")
		if !ready {
			return fmt.Errorf("Ready not True (%s)", reason)
		}
		return nil
	})
	if reason != "Committed" {
		t.Fatalf("CommitRequest Ready with reason %s, want Committed", reason)
	}
	got := u.gitOut(t, "log", "-1", "--format=%an|%cn|%B", "main", "--", u.file("feature-flags"))
	if want := "alice|kubescribe|Enable the new checkout\n\nRollout plan in ticket 42."; !strings.HasPrefix(got, want) {
		t.Fatalf("the commit of feature-flags: %q, want it to begin with %q", got, want)
	}
}

// doctor runs `kubescribe doctor` as the admin against the quickstart: it reaches the Pod's
// ops and metrics ports through the apiserver's port-forward to the real kubelet, reads
// /metrics with a token of a ServiceAccount bound to kubescribe-metrics-reader (Prometheus',
// made here as a user of the monitoring component would have it), probes audit delivery with a
// dry-run write, and must find nothing failed, each check that needs the Pod having run.
func doctor(ctx context.Context, t *testing.T, u *user) {
	if _, err := u.c.Client.CoreV1().ServiceAccounts("kubescribe").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := u.c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-kubescribe-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubescribe-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kubescribe", Name: "prometheus"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(u.cli, "doctor", "--format", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+u.c.KubeconfigPath("admin"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	began := time.Now()
	out, err := cmd.Output()
	var report struct {
		Checks []struct {
			Name, Verdict, Summary string
		}
		Failed int
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("kubescribe doctor: %v, %v\n%s\n%s", err, jerr, out, stderr.Bytes())
	}
	for _, c := range report.Checks {
		t.Logf("doctor: %-4s %-15s %s", c.Verdict, c.Name, c.Summary)
		switch c.Name {
		case "kubescribe", "redis", "audit-delivery", "rbac", "git":
			if c.Verdict != "ok" {
				t.Errorf("doctor's check %s: %s, want ok", c.Name, c.Verdict)
			}
		}
	}
	if err != nil || report.Failed != 0 {
		t.Fatalf("kubescribe doctor: %v, %d failed\n%s", err, report.Failed, stderr.Bytes())
	}
	t.Logf("kubescribe doctor: nothing failed, in %s", time.Since(began).Round(100*time.Millisecond))
}

// managed applies deploy/overlays/managed over the quickstart, as on a cluster without audit
// access: the apiserver loses its audit webhook and admission credential, the CommitRequest
// webhook is registered with the admission token in its URL (docs/install.md#managed), and
// kubescribe registers its attribution webhook itself; alice's and bob's writes keep their
// authors.
func managed(ctx context.Context, t *testing.T, u *user) {
	root, err := cluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The same credentials: the user's secrets/ of the quickstart, so that Redis keeps its
	// password.
	dst := filepath.Join(u.dir, "deploy", "overlays", "managed", "secrets")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"audit-token", "admission-token", "redis-password"} {
		b, err := os.ReadFile(u.secret("quickstart", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.c.SetAudit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	applyOverlay(ctx, t, u.c, root, u.dir, "managed")
	webhook := u.run(t, "admission-webhook-config", "--service", "kubescribe/kubescribe-admission",
		"--ca-from-secret", "kubescribe/kubescribe-tls", "--token-file", u.secret("managed", "admission-token"))
	if err := stack.Apply(ctx, u.c.AdminConfig, webhook); err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, 2*time.Minute, "kubescribe registers the attribution webhook for ConfigMaps", func() error {
		resources, err := attributionWebhookResources(ctx, u.c)
		if err != nil {
			return err
		}
		if !resources["configmaps"] {
			return fmt.Errorf("no rule for configmaps yet: %v", resources)
		}
		return nil
	})
	alice, bob := clientFor(t, u.c, "alice"), clientFor(t, u.c, "bob")
	writeConfigMap(ctx, t, bob, "managed", "1")
	u.waitAuthors(ctx, t, 90*time.Second, map[string]string{"managed": "bob"})
	writeConfigMap(ctx, t, alice, "managed", "2")
	u.waitAuthors(ctx, t, 90*time.Second, map[string]string{"managed": "alice"})
	t.Logf("commits:\n%s", u.gitLog(t))
}

// file is the path of ConfigMap default/name in the repository.
func (u *user) file(name string) string {
	return examplesPath + "/default/core/configmaps/" + name + ".yaml"
}

func (u *user) gitOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"--git-dir", u.repoDir}, args...)...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// gitLog is main's history, newest first, a line per commit: author, committer, subject.
func (u *user) gitLog(t *testing.T) string {
	return u.gitOut(t, "log", "--format=%h %an | %cn | %s", "main")
}

// waitAuthors waits until the newest commit of each ConfigMap's file is authored by the
// user named ("alice"), or, for "alice (deleted)", is alice's and removed the file.
func (u *user) waitAuthors(ctx context.Context, t *testing.T, timeout time.Duration, want map[string]string) {
	t.Helper()
	files := map[string]string{}
	for name, who := range want {
		files[u.file(name)] = who
	}
	u.waitFiles(ctx, t, timeout, files)
}

// waitFiles is waitAuthors for files of the repository, by path.
func (u *user) waitFiles(ctx context.Context, t *testing.T, timeout time.Duration, want map[string]string) {
	t.Helper()
	poll(ctx, t, timeout, fmt.Sprintf("%d files committed by their writers", len(want)), func() error {
		var wrong []string
		for file, who := range want {
			author, deleted := strings.CutSuffix(who, " (deleted)")
			got := u.gitOut(t, "log", "-1", "--format=%an", "main", "--", file)
			if got != author {
				wrong = append(wrong, fmt.Sprintf("%s by %q", file, got))
				continue
			}
			if _, err := exec.Command("git", "--git-dir", u.repoDir, "cat-file", "-e", "main:"+file).Output(); (err != nil) != deleted {
				wrong = append(wrong, fmt.Sprintf("%s present %v", file, err == nil))
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d of %d not yet: %s", len(wrong), len(want), strings.Join(first(wrong, 6), ", "))
		}
		return nil
	})
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], "...")
	}
	return s
}

// writeConfigMap creates ConfigMap default/name with v=value, or updates it.
func writeConfigMap(ctx context.Context, t *testing.T, kube kubernetes.Interface, name, value string) {
	t.Helper()
	cms := kube.CoreV1().ConfigMaps("default")
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": value}}, metav1.CreateOptions{})
	case err == nil:
		cm.Data = map[string]string{"v": value}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("writing ConfigMap %s: %v", name, err)
	}
}

func clientFor(t *testing.T, c *cluster.Cluster, name string) kubernetes.Interface {
	t.Helper()
	kube, err := kubernetes.NewForConfig(c.UserConfig(name))
	if err != nil {
		t.Fatal(err)
	}
	return kube
}

// kubescribePod is kubescribe's one Pod.
// readyPods counts the kubescribe Pods that are Ready.
func readyPods(ctx context.Context, c *cluster.Cluster) int {
	pods, err := c.Client.CoreV1().Pods("kubescribe").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kubescribe"})
	if err != nil {
		return -1 // unknown: not counted as downtime
	}
	n := 0
	for _, p := range pods.Items {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				n++
			}
		}
	}
	return n
}

// waitReady waits until kubescribe's object default/name of resource is Ready=True.
func waitReady(ctx context.Context, t *testing.T, c *cluster.Cluster, resource schema.GroupVersionResource, name string) {
	t.Helper()
	poll(ctx, t, 2*time.Minute, fmt.Sprintf("%s %s Ready", resource.Resource, name), func() error {
		if ready, reason := condition(ctx, c, resource, name); !ready {
			return fmt.Errorf("Ready not True (%s)", reason)
		}
		return nil
	})
}

// condition reads the Ready condition of kubescribe's object default/name: whether it is
// True, and its reason (or why it could not be read).
func condition(ctx context.Context, c *cluster.Cluster, resource schema.GroupVersionResource, name string) (bool, string) {
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		return false, err.Error()
	}
	obj, err := dyn.Resource(resource).Namespace("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, raw := range conds {
		cond, _ := raw.(map[string]any)
		if cond["type"] == "Ready" {
			reason, _ := cond["reason"].(string)
			msg, _ := cond["message"].(string)
			if cond["status"] == "True" {
				return true, reason
			}
			return false, reason + ": " + msg
		}
	}
	return false, "no Ready condition"
}

func roleBinding(name, clusterRole, user string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
}
