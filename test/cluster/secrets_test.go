package cluster_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/getsops/sops/v3/cmd/sops/formats"
	"github.com/getsops/sops/v3/decrypt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/cluster"
	"github.com/kubescribe/kubescribe/test/deploy"
	"github.com/kubescribe/kubescribe/test/stack"
)

// secretValues is every Secret value the steps below write: none may reach Git, Redis' volume,
// or a file the kubelet keeps for the Pods (their volumes, their logs).
type secretValues []string

// next is a new random value, recorded.
func (v *secretValues) next(what string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	s := what + "-" + hex.EncodeToString(b)
	*v = append(*v, s)
	return s
}

// secretAuthors turns Secret authors on for the quickstart as docs/install.md#secret-authors
// says (its overlay `secret-authors`: ../quickstart with components/attribution-webhook and
// components/secret-digest-key, the key from deploy/secrets.sh), then mirrors default's Secrets
// encrypted for an age recipient: kubescribe registers the attribution webhook for Secrets only;
// alice creates a Secret, bob updates it and alice deletes it, and each commit is authored by
// its writer; each committed version, decrypted with the sops library and the age key, is the
// live data; no value is found in the remote's objects, on Redis' volume, or under the kubelet's
// Pod directories and logs.
func secretAuthors(ctx context.Context, t *testing.T, u *user) {
	root, err := cluster.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := deploy.DocOverlays(root)
	if err != nil {
		t.Fatal(err)
	}
	overlay, ok := docs["secret-authors"]
	if !ok {
		t.Fatal("docs/install.md has no overlay secret-authors")
	}
	applyKustomization(ctx, t, u.c, root, u.dir, "secret-authors", overlay)
	if _, err := os.Stat(u.secret("secret-authors", "secret-digest-key")); err != nil {
		t.Fatalf("deploy/secrets.sh made no digest key: %v", err)
	}

	identity := u.encryptSecrets(ctx, t)
	poll(ctx, t, 2*time.Minute, "kubescribe registers the attribution webhook for Secrets only", func() error {
		resources, err := attributionWebhookResources(ctx, u.c)
		if err != nil {
			return err
		}
		if !resources["secrets"] {
			return fmt.Errorf("resources %v", resources)
		}
		if resources["configmaps"] {
			t.Fatalf("the webhook of an audit installation covers ConfigMaps: %v", resources)
		}
		return nil
	})

	var values secretValues
	alice, bob := clientFor(t, u.c, "alice"), clientFor(t, u.c, "bob")
	file := examplesPath + "/default/core/secrets/db.yaml"
	s, err := alice.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"},
		StringData: map[string]string{"password": values.next("create")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.waitFiles(ctx, t, 90*time.Second, map[string]string{file: "alice"})
	u.decryptsTo(t, identity, file, s.Data)

	s.Data = map[string][]byte{"password": []byte(values.next("update")), "user": []byte(values.next("user"))}
	if s, err = bob.CoreV1().Secrets("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitFiles(ctx, t, 90*time.Second, map[string]string{file: "bob"})
	u.decryptsTo(t, identity, file, s.Data)

	if err := alice.CoreV1().Secrets("default").Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	u.waitFiles(ctx, t, 90*time.Second, map[string]string{file: "alice (deleted)"})
	t.Logf("commits:\n%s", u.gitLog(t))
	u.noPlaintext(t, values)
}

// managedSecrets follows the managed step: the managed overlay has the digest key and its
// attribution webhook covers Secrets with the rest; bob's Secret is committed as his.
func managedSecrets(ctx context.Context, t *testing.T, u *user) {
	identity := u.encryptSecrets(ctx, t)
	poll(ctx, t, 2*time.Minute, "the attribution webhook covers Secrets and ConfigMaps", func() error {
		resources, err := attributionWebhookResources(ctx, u.c)
		if err != nil {
			return err
		}
		if !resources["secrets"] || !resources["configmaps"] {
			return fmt.Errorf("resources %v", resources)
		}
		return nil
	})
	var values secretValues
	file := examplesPath + "/default/core/secrets/managed-db.yaml"
	s, err := clientFor(t, u.c, "bob").CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "managed-db"},
		StringData: map[string]string{"password": values.next("managed")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.waitFiles(ctx, t, 90*time.Second, map[string]string{file: "bob"})
	u.decryptsTo(t, identity, file, s.Data)
	u.noPlaintext(t, values)
}

// encryptSecrets gives the GitTarget example an age recipient (made once, kept in u), adds the
// WatchRule secrets (every Secret of default) and grants kubescribe what it selects with
// `kubescribe rbac`, and waits until both are Ready. It returns the age identity.
func (u *user) encryptSecrets(ctx context.Context, t *testing.T) *age.X25519Identity {
	t.Helper()
	if u.age == nil {
		var err error
		if u.age, err = age.GenerateX25519Identity(); err != nil {
			t.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(u.c.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	patch := `{"spec":{"encryption":{"age":["` + u.age.Recipient().String() + `"]}}}`
	if _, err := dyn.Resource(v1alpha1.GitTargetsResource).Namespace("default").Patch(ctx, "example", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rule := `apiVersion: kubescribe.dev/v1alpha1
kind: WatchRule
metadata:
  name: secrets
  namespace: default
spec:
  targetRef:
    name: example
  rules:
    - apiGroups: [""]
      resources: ["secrets"]
`
	if err := stack.Apply(ctx, u.c.AdminConfig, []byte(rule)); err != nil {
		t.Fatal(err)
	}
	if err := stack.Apply(ctx, u.c.AdminConfig, u.run(t, "rbac")); err != nil {
		t.Fatal(err)
	}
	vouchFor(ctx, t, u.c, v1alpha1.GitTargetsResource, "example") // spec.encryption needs list on Secrets
	waitReady(ctx, t, u.c, v1alpha1.GitTargetsResource, "example")
	waitReady(ctx, t, u.c, v1alpha1.WatchRulesResource, "secrets")
	return u.age
}

// attributionWebhookResources are the resources of the attribution webhook's rules, once it
// has a CA bundle.
func attributionWebhookResources(ctx context.Context, c *cluster.Cluster) (map[string]bool, error) {
	w, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "kubescribe-attribution", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, h := range w.Webhooks {
		if len(h.ClientConfig.CABundle) == 0 {
			return nil, fmt.Errorf("webhook %s has no CA bundle yet", h.Name)
		}
		for _, r := range h.Rules {
			for _, res := range r.Resources {
				out[res] = true
			}
		}
	}
	return out, nil
}

// decryptsTo checks that main's file is a SOPS document for identity's recipient, with the
// Secret's metadata readable, and that the sops library, as Flux's kustomize-controller
// decrypts it, gives data.
func (u *user) decryptsTo(t *testing.T, identity *age.X25519Identity, file string, data map[string][]byte) {
	t.Helper()
	enc := u.gitOut(t, "show", "main:"+file)
	for _, want := range []string{"sops:", identity.Recipient().String(), "kind: Secret"} {
		if !strings.Contains(enc, want) {
			t.Fatalf("%s holds no %q:\n%s", file, want, enc)
		}
	}
	t.Setenv("SOPS_AGE_KEY", identity.String())
	plain, err := decrypt.DataWithFormat([]byte(enc+"\n"), formats.Yaml)
	if err != nil {
		t.Fatalf("decrypting %s: %v", file, err)
	}
	var got corev1.Secret
	if err := yaml.Unmarshal(plain, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != len(data) {
		t.Fatalf("%s decrypts to keys %v, want %d", file, got.Data, len(data))
	}
	for k, v := range data {
		if string(got.Data[k]) != string(v) {
			t.Fatalf("%s decrypts to another value of %s", file, k)
		}
	}
}

// noPlaintext looks for each value, as written and base64-encoded, in every object of the
// remote, on Redis' volume, and in the files the kubelet keeps for the Pods: their volumes (the
// kubelet's root directory) and their logs.
func (u *user) noPlaintext(t *testing.T, values secretValues) {
	t.Helper()
	objects, err := exec.Command("git", "--git-dir", u.repoDir, "cat-file", "--batch-all-objects", "--batch").Output()
	if err != nil {
		t.Fatal(err)
	}
	places := map[string][]byte{"the remote's objects": objects}
	files := 0
	for _, dir := range []string{filepath.Join(u.c.Dir, "volumes"), filepath.Join(u.c.Dir, "kubelet", "root", "pods"), filepath.Join(u.c.Dir, "kubelet", "pod-logs")} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			places[path] = b
			files++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range values {
		for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
			for where, b := range places {
				if strings.Contains(string(b), form) {
					t.Errorf("a Secret value in %s", where)
				}
			}
		}
	}
	t.Logf("%d values: none in the remote's objects nor in %d files of volumes, Pods and logs", len(values), files)
}
