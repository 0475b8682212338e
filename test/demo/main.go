// Command demo runs kubescribe end to end on this machine: a real kube-apiserver, etcd, Redis
// and Git server, kubescribe in-process, and two users changing ConfigMaps with kubectl-like
// calls, then one closing her changes with a CommitRequest and a message. It prints the
// resulting Git history and how to poke at the running stack. Run it with `make demo`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"

	"github.com/kubescribe/kubescribe/test/stack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "kubescribe-demo-")
	if err != nil {
		return err
	}
	step("starting etcd, kube-apiserver, redis-server, a Git server and kubescribe in %s", dir)
	s, err := stack.Start(ctx, stack.Options{Dir: dir, Logf: func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer func() {
		step("stopping")
		if err := s.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: stopping:", err)
		}
	}()

	repoDir, err := s.Git.CreateRepo("demo")
	if err != nil {
		return err
	}
	caFile := filepath.Join(dir, "certs", "ca.crt")
	step("as admin: namespace demo, a Role letting alice and bob edit ConfigMaps, and the mirror:")
	manifests := demoManifests(s)
	fmt.Println(indent(redact(manifests, s.Git.Password)))
	if err := stack.Apply(ctx, s.AdminConfig, []byte(manifests)); err != nil {
		return err
	}
	if err := waitRuleReady(ctx, s); err != nil {
		return err
	}

	alice, err := kubernetes.NewForConfig(s.UserConfig("alice"))
	if err != nil {
		return err
	}
	bob, err := kubernetes.NewForConfig(s.UserConfig("bob"))
	if err != nil {
		return err
	}
	cms := func(c kubernetes.Interface) interface {
		Create(context.Context, *corev1.ConfigMap, metav1.CreateOptions) (*corev1.ConfigMap, error)
		Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*corev1.ConfigMap, error)
		Delete(context.Context, string, metav1.DeleteOptions) error
	} {
		return c.CoreV1().ConfigMaps("demo")
	}
	changes := []struct {
		who  string
		what string
		do   func() error
	}{
		{"alice", "creates ConfigMap shop-config", func() error {
			_, err := cms(alice).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "shop-config"},
				Data: map[string]string{"currency": "EUR", "greeting": "Welcome!"}}, metav1.CreateOptions{})
			return err
		}},
		{"bob", "changes its greeting", func() error {
			_, err := cms(bob).Patch(ctx, "shop-config", types.MergePatchType, []byte(`{"data":{"greeting":"Hello there!"}}`), metav1.PatchOptions{})
			return err
		}},
		{"alice", "creates ConfigMap feature-flags", func() error {
			_, err := cms(alice).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "feature-flags"},
				Data: map[string]string{"checkout-v2": "false"}}, metav1.CreateOptions{})
			return err
		}},
		{"bob", "deletes ConfigMap feature-flags", func() error {
			return cms(bob).Delete(ctx, "feature-flags", metav1.DeleteOptions{})
		}},
	}
	for i, c := range changes {
		step("as %s: %s", c.who, c.what)
		if err := c.do(); err != nil {
			return fmt.Errorf("%s: %w", c.who, err)
		}
		if err := waitCommits(ctx, repoDir, i+1); err != nil {
			return err
		}
	}

	step("the repository's history (git log on the server):")
	out, _ := exec.Command("git", "--git-dir", repoDir, "log", "--format=%h  author: %an <%ae>  committer: %cn%n         %s", "main").CombinedOutput()
	fmt.Println(indent(string(out)))
	step("what Git holds for demo/shop-config:")
	out, _ = exec.Command("git", "--git-dir", repoDir, "show", "main:clusters/demo/demo/core/configmaps/shop-config.yaml").CombinedOutput()
	fmt.Println(indent(string(out)))

	if err := commitRequestDemo(ctx, s, alice); err != nil {
		return err
	}

	fmt.Printf(`==> the stack is running; try it yourself:
    kubectl --kubeconfig %s -n demo create configmap mine --from-literal=k=v
    kubectl --kubeconfig %s -n demo edit configmap shop-config
    kubectl --kubeconfig %s get gitproviders,gittargets,watchrules,commitrequests -A -o wide
    git -c http.sslCAInfo=%s clone %s /tmp/demo-clone   (user %s, password in %s)
    git --git-dir %s log --format='%%an: %%s' main
    curl -s --cacert %s -H "Authorization: Bearer $(cat %s)" %s | grep ^kubescribe_
    logs: %s
`, s.KubeconfigPath("alice"), s.KubeconfigPath("bob"), s.KubeconfigPath("admin"), caFile, s.Git.URL("demo"),
		s.Git.Username, filepath.Join(dir, "git-password"), repoDir, caFile, filepath.Join(dir, "metrics-token"), s.MetricsURL,
		strings.Join(s.LogPaths(), " "))
	if err := os.WriteFile(filepath.Join(dir, "git-password"), []byte(s.Git.Password+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics-token"), []byte(s.MetricsToken+"\n"), 0o600); err != nil {
		return err
	}
	if term.IsTerminal(int(os.Stdin.Fd())) {
		fmt.Println("==> press Ctrl-C to stop everything")
		<-ctx.Done()
	} else {
		fmt.Println("==> not run from a terminal: stopping now (run `make demo` in a terminal to keep it up)")
	}
	return nil
}

func demoManifests(s *stack.Stack) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: demo
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-editors, namespace: demo}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: configmap-editors, namespace: demo}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-editors}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
---
apiVersion: v1
kind: Secret
metadata: {name: git-credentials, namespace: demo}
stringData:
  username: %s
  password: %s
  ca.crt: |
%s
---
apiVersion: kubescribe.dev/v1alpha1
kind: GitProvider
metadata: {name: demo-repo, namespace: demo}
spec:
  url: %s
  secretRef: {name: git-credentials}
  commitWindow: 1s
---
apiVersion: kubescribe.dev/v1alpha1
kind: GitTarget
metadata: {name: demo, namespace: demo}
spec:
  providerRef: {name: demo-repo}
  branch: main
  path: clusters/demo
---
apiVersion: kubescribe.dev/v1alpha1
kind: WatchRule
metadata: {name: configmaps, namespace: demo}
spec:
  targetRef: {name: demo}
  rules:
  - apiGroups: [""]
    resources: [configmaps]
`, s.Git.Username, s.Git.Password, indentBy(string(s.Git.CAData), "    "), s.Git.URL("demo"))
}

// commitRequestDemo shows a CommitRequest: in namespace why, whose provider holds a window
// open for two minutes, alice makes two changes and closes her window with a message.
func commitRequestDemo(ctx context.Context, s *stack.Stack, alice kubernetes.Interface) error {
	repoDir, err := s.Git.CreateRepo("why")
	if err != nil {
		return err
	}
	step("as admin: namespace why, where alice may also create CommitRequests; its GitProvider keeps a window open for 2m:")
	manifests := strings.NewReplacer(
		"metadata: {name: demo, namespace: demo}", "metadata: {name: why, namespace: why}",
		"name: demo\n", "name: why\n", "namespace: demo}", "namespace: why}",
		"name: demo-repo", "name: why-repo", "commitWindow: 1s", "commitWindow: 2m",
		"path: clusters/demo", "path: clusters/why", "targetRef: {name: demo}", "targetRef: {name: why}",
		"providerRef: {name: demo-repo}", "providerRef: {name: why-repo}", s.Git.URL("demo"), s.Git.URL("why"),
		"- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}\n", "",
		"  verbs: [get, list, watch, create, update, patch, delete]\n",
		"  verbs: [get, list, watch, create, update, patch, delete]\n- apiGroups: [kubescribe.dev]\n  resources: [commitrequests]\n  verbs: [get, list, watch, create]\n",
	).Replace(demoManifests(s))
	if err := stack.Apply(ctx, s.AdminConfig, []byte(manifests)); err != nil {
		return err
	}
	if err := waitReady(ctx, s, v1alpha1.WatchRulesResource, "why", "configmaps"); err != nil {
		return err
	}
	step("as alice: creates ConfigMaps quota and limits (one window: nothing is committed yet)")
	for _, name := range []string{"quota", "limits"} {
		if _, err := alice.CoreV1().ConfigMaps("why").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string]string{"tenant": "jane"}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("alice: %w", err)
		}
	}
	request := `apiVersion: kubescribe.dev/v1alpha1
kind: CommitRequest
metadata: {name: onboard-jane, namespace: why}
spec:
  targetRef: {name: why}
  message: |
    Onboard tenant jane

    Quota and limits as agreed in ticket 42.
  closeDelaySeconds: 5
`
	step("as alice: a CommitRequest closes her window with her message (after 5s, so her changes' audit events are in):")
	fmt.Println(indent(request))
	if err := stack.Apply(ctx, s.UserConfig("alice"), []byte(request)); err != nil {
		return err
	}
	if err := waitReady(ctx, s, v1alpha1.CommitRequestsResource, "why", "onboard-jane"); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	u, err := dyn.Resource(v1alpha1.CommitRequestsResource).Namespace("why").Get(ctx, "onboard-jane", metav1.GetOptions{})
	if err != nil {
		return err
	}
	sha, _, _ := unstructured.NestedString(u.Object, "status", "sha")
	step("CommitRequest why/onboard-jane is Ready (Committed), status.sha %s; the commit:", sha)
	out, _ := exec.Command("git", "--git-dir", repoDir, "log", "-1", "--format=author: %an <%ae>  committer: %cn%n%n%B", "main").CombinedOutput()
	fmt.Println(indent(string(out)))
	return nil
}

func waitRuleReady(ctx context.Context, s *stack.Stack) error {
	return waitReady(ctx, s, v1alpha1.WatchRulesResource, "demo", "configmaps")
}

// waitReady waits until the object's Ready condition is True.
func waitReady(ctx context.Context, s *stack.Stack, gvr schema.GroupVersionResource, ns, name string) error {
	dyn, err := dynamic.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		u, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == v1alpha1.ConditionReady && m["status"] == "True" {
					return nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s %s/%s not Ready after a minute; see %s", gvr.Resource, ns, name, s.LogPath)
}

func waitCommits(ctx context.Context, repoDir string, n int) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, err := exec.CommandContext(ctx, "git", "--git-dir", repoDir, "rev-list", "--count", "main").Output()
		if err == nil && strings.TrimSpace(string(out)) == fmt.Sprint(n) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("commit %d did not reach the repository within a minute", n)
}

func indent(s string) string { return indentBy(strings.TrimRight(s, "\n"), "    ") }

func indentBy(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

func redact(s, secret string) string {
	s = strings.ReplaceAll(s, secret, "<generated password>")
	if i := strings.Index(s, "  ca.crt: |\n"); i >= 0 {
		end := strings.Index(s[i:], "\n---")
		s = s[:i] + "  ca.crt: <the test CA>" + s[i+end:]
	}
	return s
}
