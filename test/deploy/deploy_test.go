package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

const (
	root      = "../.."
	namespace = "kubescribe"
)

// The Services of deploy/base, by name: port and the container port they target.
var services = map[string]struct {
	port   int64
	target string
}{
	"kubescribe-audit":     {8443, "audit"},
	"kubescribe-admission": {9443, "admission"},
	"kubescribe-metrics":   {8081, "metrics"},
}

// clusterScoped are the kinds of the builds without a namespace.
var clusterScoped = []string{"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"}

func buildOverlay(t *testing.T, overlay string, env ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := BuildOverlay(root, t.TempDir(), overlay, nil, env...)
	require.NoError(t, err)
	return objs
}

// TestCRDKustomizationListsEveryCRD: deploy/crds/kustomization.yaml is written by hand; a CRD
// `make generate` adds must not be left out of every install.
func TestCRDKustomizationListsEveryCRD(t *testing.T) {
	generated, err := filepath.Glob(filepath.Join(root, "deploy", "crds", "kubescribe.dev_*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, generated)
	var want []string
	for _, f := range generated {
		want = append(want, filepath.Base(f))
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "crds", "kustomization.yaml"))
	require.NoError(t, err)
	var k struct {
		Resources []string `json:"resources"`
	}
	require.NoError(t, yaml.Unmarshal(b, &k))
	slices.Sort(k.Resources)
	require.Equal(t, want, k.Resources)
}

// want is what one installation must hold beyond what every one holds (checkInstall).
type want struct {
	args, noArgs []string
	// webhook: "self-managed" (its caBundle set by kubescribe at run time), "cert-manager"
	// (injected), or "" (left out of the build).
	webhook string
	// selfManaged: kubescribe keeps its own certificates in a Secret (components/self-managed-tls).
	selfManaged bool
	// attributionRBAC: the attribution webhook's ClusterRole is in the build, and kubescribe
	// registers the webhook (--attribution-webhook-service): components/attribution-webhook.
	attributionRBAC bool
	// secretDigestKey: kubescribe reads the digest key of Secrets' writes from the Secret
	// kubescribe-secret-digest-key the build generates (components/secret-digest-key).
	secretDigestKey bool
	// redisAddr, when set, is a Redis of the installation's own: no Redis in the build.
	redisAddr string
}

var overlayWants = map[string]want{
	"quickstart": {
		args: []string{"--audit-token-file=/etc/kubescribe/audit/token", "--admission-token-file=/etc/kubescribe/admission/token",
			"--tls-self-managed-secret=kubescribe/kubescribe-tls", "--tls-self-managed-webhooks=kubescribe-commitrequests"},
		noArgs: []string{"--audit-client-ca-file", "--admission-client-ca-file", "--attribution-source", "--attribution-webhook-service", "--tls-cert-file",
			"--secret-digest-key-file"},
		webhook:     "self-managed",
		selfManaged: true,
	},
	"cert-manager": {
		args: []string{"--audit-client-ca-file=/etc/kubescribe/audit/ca.crt", "--audit-client-cert-routes=kube-apiserver-local=local",
			"--admission-client-ca-file=/etc/kubescribe/admission/ca.crt"},
		noArgs: []string{"--audit-token-file", "--admission-token-file", "--attribution-source", "--attribution-webhook-service", "--tls-self-managed-secret",
			"--secret-digest-key-file"},
		webhook: "cert-manager",
	},
	"managed": {
		args: []string{"--audit-token-file=/etc/kubescribe/audit/token", "--admission-token-file=/etc/kubescribe/admission/token",
			"--attribution-source=admission", "--attribution-webhook-service=kubescribe/kubescribe-admission",
			"--tls-self-managed-secret=kubescribe/kubescribe-tls", "--secret-digest-key-file=/etc/kubescribe/secret-digest/key"},
		noArgs:          []string{"--admission-client-ca-file", "--audit-client-ca-file", "--attribution-webhook-ca-file", "--tls-cert-file"},
		attributionRBAC: true,
		secretDigestKey: true,
		selfManaged:     true,
	},
}

// TestDocOverlaysBuild: the overlays docs/install.md shows are installations too.
func TestDocOverlaysBuild(t *testing.T) {
	docs, err := DocOverlays(root)
	require.NoError(t, err)
	wants := map[string]struct {
		want
		kubescribeImage, redisImage string
	}{
		"managed-cert-manager": {want{
			args: []string{"--audit-client-ca-file=/etc/kubescribe/audit/ca.crt", "--audit-client-cert-routes=kube-apiserver-local=local",
				"--admission-token-file=/etc/kubescribe/admission/token", "--attribution-source=admission",
				"--attribution-webhook-service=kubescribe/kubescribe-admission", "--attribution-webhook-ca-file=/etc/kubescribe/tls/ca.crt",
				"--secret-digest-key-file=/etc/kubescribe/secret-digest/key"},
			noArgs:          []string{"--audit-token-file", "--admission-client-ca-file"},
			attributionRBAC: true,
			secretDigestKey: true,
		}, "registry.example.com/platform/kubescribe:0.1.0", "registry.example.com/mirror/redis:7.4"},
		// The quickstart with Secrets' authors (docs/install.md#secret-authors): authors from
		// audit events, the webhook for Secrets only.
		"secret-authors": {want{
			args: []string{"--audit-token-file=/etc/kubescribe/audit/token", "--admission-token-file=/etc/kubescribe/admission/token",
				"--tls-self-managed-secret=kubescribe/kubescribe-tls", "--tls-self-managed-webhooks=kubescribe-commitrequests",
				"--attribution-webhook-service=kubescribe/kubescribe-admission", "--secret-digest-key-file=/etc/kubescribe/secret-digest/key"},
			noArgs:          []string{"--audit-client-ca-file", "--admission-client-ca-file", "--attribution-source", "--attribution-webhook-ca-file", "--tls-cert-file"},
			webhook:         "self-managed",
			selfManaged:     true,
			attributionRBAC: true,
			secretDigestKey: true,
		}, "kubescribe:dev", "redis:7"},
		"own-redis": {want{
			args:      []string{"--audit-client-ca-file=/etc/kubescribe/audit/ca.crt", "--admission-client-ca-file=/etc/kubescribe/admission/ca.crt"},
			noArgs:    []string{"--audit-token-file", "--attribution-source"},
			webhook:   "cert-manager",
			redisAddr: "redis-master.redis.svc:6379",
		}, "kubescribe:dev", ""},
	}
	require.Len(t, docs, len(wants))
	for name, kustomization := range docs {
		t.Run(name, func(t *testing.T) {
			w, ok := wants[name]
			require.True(t, ok, "docs/install.md shows an overlay this test does not know")
			objs, err := BuildOverlay(root, t.TempDir(), name, kustomization)
			require.NoError(t, err)
			checkInstall(t, objs, w.want, w.kubescribeImage, w.redisImage)
			if name == "managed-cert-manager" {
				np := Find(objs, "NetworkPolicy", "kubescribe")
				from, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
				require.Equal(t, []any{map[string]any{"ipBlock": map[string]any{"cidr": "172.16.0.0/28"}}}, from[0].(map[string]any)["from"])
			}
		})
	}
}

func TestOverlaysBuild(t *testing.T) {
	require.Len(t, overlayWants, len(Overlays))
	for _, overlay := range Overlays {
		t.Run(overlay, func(t *testing.T) {
			objs := buildOverlay(t, overlay)
			checkInstall(t, objs, overlayWants[overlay], "kubescribe:dev", "redis:7")
		})
	}
}

// checkInstall checks what makes a build a working installation: kubescribe's arguments,
// files and environment resolve to objects of the build, its Services and NetworkPolicy reach
// its ports, Redis has its password, the webhook its CA, and nothing grants more than the
// least-privilege rules.
func checkInstall(t *testing.T, objs []*unstructured.Unstructured, w want, kubescribeImage, redisImage string) {
	t.Helper()
	for _, o := range objs {
		if !slices.Contains(clusterScoped, o.GetKind()) {
			require.Equal(t, namespace, o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
		}
		b, err := yaml.Marshal(o.Object)
		require.NoError(t, err)
		require.NotContains(t, string(b), "PLACEHOLDER", "%s %s", o.GetKind(), o.GetName())
	}

	// kubescribe: the image, every flag naming a file finds it, the Redis address resolves.
	dep := Find(objs, "Deployment", "kubescribe")
	require.NotNil(t, dep)
	c, _, err := Container(dep, "kubescribe")
	require.NoError(t, err)
	require.Equal(t, kubescribeImage, c.Image)
	require.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy)
	files, err := PodFiles(objs, dep, "kubescribe")
	require.NoError(t, err)
	for _, a := range c.Args {
		if _, p, ok := strings.Cut(a, "=/etc/kubescribe/"); ok {
			require.Contains(t, files, "/etc/kubescribe/"+p, "%s: no such file in the Pod", a)
		}
	}
	for _, a := range w.args {
		require.Contains(t, c.Args, a)
	}
	for _, flag := range w.noArgs {
		require.False(t, slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, flag+"=") }), "%s in %q", flag, c.Args)
	}
	require.Contains(t, c.Args, "--redis-addr=$(REDIS_ADDR)")
	require.Contains(t, c.Args, "--redis-password-file=/etc/kubescribe/redis/password")
	addr, err := EnvFrom(objs, c, "REDIS_ADDR")
	require.NoError(t, err)
	if w.redisAddr != "" {
		require.Equal(t, w.redisAddr, addr)
	} else {
		require.Equal(t, "kubescribe-redis:6379", addr)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")

	// Its Services, one per listener.
	for name, s := range services {
		svc := Find(objs, "Service", name)
		require.NotNil(t, svc, name)
		selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		require.Subset(t, podLabels, selector, name)
		svcPorts, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		require.Len(t, svcPorts, 1, name)
		require.Equal(t, s.port, svcPorts[0].(map[string]any)["port"], name)
		require.Equal(t, s.target, svcPorts[0].(map[string]any)["targetPort"], name)
		require.Contains(t, ports, s.target, name)
	}

	// Its NetworkPolicy admits the listener ports, by the container's names.
	np := Find(objs, "NetworkPolicy", "kubescribe")
	require.NotNil(t, np)
	selected, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	require.Subset(t, podLabels, selected)
	var admitted []string
	ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	for _, rule := range ingress {
		for _, p := range rule.(map[string]any)["ports"].([]any) {
			admitted = append(admitted, p.(map[string]any)["port"].(string))
		}
	}
	require.ElementsMatch(t, []string{"audit", "admission", "health", "metrics"}, admitted)

	// Redis: its image, its password file, its Service.
	redis := Find(objs, "StatefulSet", "kubescribe-redis")
	if w.redisAddr != "" {
		require.Nil(t, redis)
		require.NotEmpty(t, files["/etc/kubescribe/redis/password"])
	} else {
		checkRedis(t, objs, redis, files, redisImage)
	}
	// The CommitRequest webhook and its CA.
	vwc := Find(objs, "ValidatingWebhookConfiguration", "kubescribe-commitrequests")
	switch w.webhook {
	case "self-managed":
		require.NotNil(t, vwc)
		hooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
		require.Len(t, hooks, 3) // CommitRequests (2) and Secret references
		for _, h := range hooks {
			_, found, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "caBundle")
			require.False(t, found, "kubescribe sets the caBundle; apply -k must not own it")
			svcName, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "name")
			require.Contains(t, services, svcName)
		}
		require.Empty(t, vwc.GetAnnotations())
	case "cert-manager":
		require.NotNil(t, vwc)
		require.Equal(t, "kubescribe/kubescribe-tls", vwc.GetAnnotations()["cert-manager.io/inject-ca-from"])
		cert := Find(objs, "Certificate", "kubescribe-tls")
		require.NotNil(t, cert)
		dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		for name := range services {
			require.Contains(t, dnsNames, name+"."+namespace+".svc")
		}
	default:
		require.Nil(t, vwc, "left out of this build")
	}

	// Self-managed TLS: no certificate file is mounted, and the certificate's names are the
	// Services'.
	if w.selfManaged {
		require.Nil(t, Find(objs, "Secret", "kubescribe-tls"))
		for p := range files {
			require.False(t, strings.HasPrefix(p, "/etc/kubescribe/tls/"), "%s mounted", p)
		}
		require.NotNil(t, Find(objs, "Role", "kubescribe-self-managed-tls"))
	}
	require.Equal(t, w.selfManaged, Find(objs, "ClusterRole", "kubescribe-self-managed-tls") != nil)

	// RBAC: least privilege in every build; the attribution webhook's rights only where asked.
	// Secrets only in the self-managed TLS Role of kubescribe's namespace: its own Secret by
	// name, and create (which RBAC cannot limit by name) in that namespace only.
	require.Equal(t, w.attributionRBAC, Find(objs, "ClusterRole", "kubescribe-attribution-webhook") != nil)
	require.Equal(t, w.attributionRBAC, slices.Contains(c.Args, "--attribution-webhook-service=kubescribe/kubescribe-admission"),
		"the webhook registered by kubescribe and its RBAC go together: %q", c.Args)
	checkSecretDigestKey(t, objs, dep, files, w.secretDigestKey)
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		var role rbacv1.ClusterRole
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
		for _, r := range role.Rules {
			for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs} {
				require.NotContains(t, list, "*", "%s %s grants a wildcard", o.GetKind(), o.GetName())
			}
			if !slices.Contains(r.Resources, "secrets") {
				continue
			}
			require.True(t, o.GetKind() == "Role" && o.GetName() == "kubescribe-self-managed-tls" && o.GetNamespace() == namespace,
				"%s %s grants Secrets", o.GetKind(), o.GetName())
			require.Equal(t, []string{"secrets"}, r.Resources)
			if !slices.Equal(r.Verbs, []string{"create"}) {
				require.Equal(t, []string{"kubescribe-tls"}, r.ResourceNames, "%v on any Secret", r.Verbs)
				require.Subset(t, []string{"get", "update"}, r.Verbs)
			}
		}
	}
}

// checkSecretDigestKey: with the key (components/secret-digest-key), kubescribe reads it from
// the Secret kubescribe-secret-digest-key the build generates, mounted read-only, 32 random
// bytes in hex; without it, nothing of it is in the build.
func checkSecretDigestKey(t *testing.T, objs []*unstructured.Unstructured, dep *unstructured.Unstructured, files map[string][]byte, want bool) {
	t.Helper()
	const file = "/etc/kubescribe/secret-digest/key"
	c, volumes, err := Container(dep, "kubescribe")
	require.NoError(t, err)
	var secret *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Secret" && strings.HasPrefix(o.GetName(), "kubescribe-secret-digest-key") {
			require.Nil(t, secret, "two Secrets kubescribe-secret-digest-key")
			secret = o
		}
	}
	if !want {
		require.NotContains(t, c.Args, "--secret-digest-key-file="+file)
		require.NotContains(t, files, file)
		require.Nil(t, secret)
		return
	}
	require.Contains(t, c.Args, "--secret-digest-key-file="+file)
	require.NotNil(t, secret, "the Secret kubescribe-secret-digest-key is generated")
	require.Equal(t, namespace, secret.GetNamespace())
	i := slices.IndexFunc(volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == secret.GetName() })
	require.GreaterOrEqual(t, i, 0, "no volume of the Secret %s", secret.GetName())
	j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volumes[i].Name })
	require.GreaterOrEqual(t, j, 0, "the volume %s is not mounted", volumes[i].Name)
	require.True(t, c.VolumeMounts[j].ReadOnly)
	require.Equal(t, "/etc/kubescribe/secret-digest", c.VolumeMounts[j].MountPath)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}\n$`), string(files[file]))
}

func checkRedis(t *testing.T, objs []*unstructured.Unstructured, redis *unstructured.Unstructured, files map[string][]byte, redisImage string) {
	t.Helper()
	require.NotNil(t, redis)
	rc, _, err := Container(redis, "redis")
	require.NoError(t, err)
	require.Equal(t, redisImage, rc.Image)
	require.Equal(t, corev1.PullIfNotPresent, rc.ImagePullPolicy)
	initContainers, _, _ := unstructured.NestedSlice(redis.Object, "spec", "template", "spec", "initContainers")
	require.Len(t, initContainers, 1)
	require.Equal(t, redisImage, initContainers[0].(map[string]any)["image"])
	redisFiles, err := PodFiles(objs, redis, "redis")
	require.NoError(t, err)
	require.Equal(t, files["/etc/kubescribe/redis/password"], redisFiles["/etc/redis-secret/password"], "kubescribe and Redis share the password")
	require.NotEmpty(t, redisFiles["/etc/redis-secret/password"])
	require.NotNil(t, Find(objs, "Service", "kubescribe-redis"))
	require.NotNil(t, Find(objs, "NetworkPolicy", "kubescribe-redis"))
}

// TestSecretsScript: deploy/secrets.sh makes what the overlay reads (tokens, Redis' password, the
// digest key of Secrets' writes: no certificate, kubescribe makes its own), owner-only, and changes nothing when run again; an
// overlay that reads a certificate from secrets/ is told where certificates come from now.
func TestSecretsScript(t *testing.T) {
	deployDir, err := Copy(root, t.TempDir())
	require.NoError(t, err)
	overlay := filepath.Join(deployDir, "overlays", "quickstart")
	require.NoError(t, MakeSecrets(deployDir, overlay))
	dir := filepath.Join(overlay, "secrets")

	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		info, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), name)
		return b
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var made []string
	for _, e := range entries {
		made = append(made, e.Name())
	}
	require.ElementsMatch(t, []string{"audit-token", "admission-token", "redis-password"}, made)
	for _, token := range made {
		require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}\n$`), string(read(token)))
	}
	require.NotEqual(t, read("audit-token"), read("admission-token"))

	// Again: nothing changes.
	before := map[string][]byte{}
	for _, name := range made {
		before[name] = read(name)
	}
	require.NoError(t, MakeSecrets(deployDir, overlay))
	for name, b := range before {
		require.True(t, bytes.Equal(b, read(name)), name)
	}

	// The managed overlay reads the digest key of Secrets' writes too.
	managed := filepath.Join(deployDir, "overlays", "managed")
	require.NoError(t, MakeSecrets(deployDir, managed))
	key, err := os.ReadFile(filepath.Join(managed, "secrets", "secret-digest-key"))
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}\n$`), string(key))
	info, err := os.Stat(filepath.Join(managed, "secrets", "secret-digest-key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	// An overlay of one's own that still reads a certificate from secrets/.
	own := filepath.Join(deployDir, "overlays", "own")
	require.NoError(t, os.MkdirAll(own, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(own, "kustomization.yaml"), []byte("secretGenerator:\n  - name: kubescribe-tls\n    files: [tls.crt=secrets/tls.crt]\n"), 0o600))
	err = MakeSecrets(deployDir, own)
	require.ErrorContains(t, err, "does not know how to make")
	require.ErrorContains(t, err, "self-managed-tls")
}
