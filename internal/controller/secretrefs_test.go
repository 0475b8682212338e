package controller

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"filippo.io/age"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/git"
)

// memoryRefs is an in-memory authz.SecretRefStore: what admission vouched for.
type memoryRefs struct {
	mu       sync.Mutex
	verdicts map[string]authz.SecretRefVerdict // uid/digest
	lookups  int
}

func (m *memoryRefs) LookupSecretRefs(_ context.Context, uid types.UID, digest string) (authz.SecretRefVerdict, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lookups++
	v, ok := m.verdicts[string(uid)+"/"+digest]
	return v, ok, nil
}

func (m *memoryRefs) ForgetSecretRefs(_ context.Context, uid types.UID, keep string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.verdicts {
		if strings.HasPrefix(k, string(uid)+"/") && k != string(uid)+"/"+keep {
			delete(m.verdicts, k)
		}
	}
	return nil
}

// vouch records what the webhook records when someone who may read refs creates or updates
// an object with spec.
func (m *memoryRefs) vouch(t *testing.T, uid types.UID, spec any, refs authz.SecretRefs) {
	t.Helper()
	digest, err := authz.SpecDigest(spec)
	require.NoError(t, err)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.verdicts == nil {
		m.verdicts = map[string]authz.SecretRefVerdict{}
	}
	m.verdicts[string(uid)+"/"+digest] = authz.SecretRefVerdict{UID: uid, Digest: digest, User: "alice", Refs: refs}
}

// gitServer is a Git server that records the Authorization header of every request and
// answers 401, as a repository asking for credentials does.
type gitServer struct {
	mu   sync.Mutex
	auth []string
}

func (g *gitServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.auth = append(g.auth, r.Header.Get("Authorization"))
	g.mu.Unlock()
	if r.Header.Get("Authorization") == "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	http.Error(w, "no such repository", http.StatusNotFound)
}

func (g *gitServer) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.auth...)
}

// The confused deputy, with the webhook bypassed: mallory, who may write GitProviders but may
// not read the Secret "creds", names it in a GitProvider for her own server. No admission
// record vouches for that spec, so kubescribe never reads the Secret and sends nothing to her
// server (it records no request, let alone an Authorization header). Once someone who may read
// the Secret vouched for this very spec, the credentials are used; an earlier spec's record
// (another URL) vouches for nothing.
func TestSecretReferenceUnverifiedSendsNothing(t *testing.T) {
	attacker := &gitServer{}
	srv := httptest.NewServer(attacker)
	t.Cleanup(srv.Close)
	refs := &memoryRefs{}
	evil := newProvider("evil", srv.URL+"/loot.git")
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{evil}, secrets: []runtime.Object{credsSecret()}, secretRefs: refs})
	f.c.opts.ProbeRemote = git.Probe // the real probe: what it sends, the server sees

	// An earlier spec (another URL) of the same object was vouched for: it does not count.
	earlier := evil.Spec.DeepCopy()
	earlier.URL = "https://git.example/team.git"
	refs.vouch(t, evil.UID, earlier, authz.SecretRefs{Get: []string{"creds"}})

	require.NoError(t, f.syncProvider("evil"))
	p := f.provider("evil")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretReferenceUnverified,
		`"creds"`, "kubescribe.dev/verify")
	require.Empty(t, attacker.seen(), "nothing is sent to the URL of an unverified GitProvider")
	for _, a := range f.kube.Actions() {
		require.False(t, a.GetVerb() == "get" && a.GetResource().Resource == "secrets", "the Secret of an unverified GitProvider is never read: %v", a)
	}
	require.Nil(t, f.settings("evil"))

	// The same spec vouched for by someone who may read the Secret: its credentials are used.
	refs.vouch(t, evil.UID, f.provider("evil").Spec, authz.SecretRefs{Get: []string{"creds"}})
	_ = f.syncProvider("evil") // the fake server has no repository: it fails, after authenticating
	var sent []string
	for _, a := range attacker.seen() {
		if a != "" {
			sent = append(sent, a)
		}
	}
	require.NotEmpty(t, sent, "a vouched-for provider authenticates")
	decoded, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sent[0], "Basic "))
	require.NoError(t, err)
	require.Contains(t, string(decoded), testPassword)
}

// A GitTarget encrypting Secrets for recipients of its creator's choosing is used only when
// someone who may list the namespace's Secrets vouched for it: a record of get alone is not
// enough. A GitTarget with a remote cluster's kubeconfig not vouched for never reads it.
func TestSecretReferenceUnverifiedTargets(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	refs := &memoryRefs{}
	remote := &remoteFake{}
	encrypting := newTarget("sealed", "git", "main", "sealed", func(t *v1alpha1.GitTarget) {
		t.Spec.Encryption = &v1alpha1.Encryption{Age: []string{id.Recipient().String()}}
	})
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), encrypting, remoteTarget("edge", "edge-kc", "edge")},
		secrets: []runtime.Object{credsSecret(),
			newSecret("edge-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "tok")})},
		secretRefs: refs, sourceClients: remote.clients,
	})
	refs.vouch(t, f.provider("git").UID, f.provider("git").Spec, authz.SecretRefs{Get: []string{"creds"}})
	require.NoError(t, f.syncProvider("git"))

	require.NoError(t, f.syncTarget("sealed"))
	got := f.target("sealed")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretReferenceUnverified, "list on Secrets")
	_, routed := f.route("sealed")
	require.False(t, routed)
	refs.vouch(t, encrypting.UID, f.target("sealed").Spec, authz.SecretRefs{}) // a record without list
	require.NoError(t, f.syncTarget("sealed"))
	requireReady(t, f.target("sealed").Status.Conditions, testGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretReferenceUnverified)
	refs.vouch(t, encrypting.UID, f.target("sealed").Spec, authz.SecretRefs{List: true})
	require.NoError(t, f.syncTarget("sealed"))
	got = f.target("sealed")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)

	require.NoError(t, f.syncTarget("edge"))
	got = f.target("edge")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretReferenceUnverified, `"edge-kc"`)
	require.NotContains(t, f.secretReads(testNS), "edge-kc", "the kubeconfig of an unverified GitTarget is never read")
	require.Empty(t, remote.builds)
	edge := f.target("edge")
	refs.vouch(t, edge.UID, edge.Spec, authz.SecretRefs{Get: []string{"edge-kc"}})
	got = f.syncProbed(t, "edge", v1alpha1.ReasonReachable)
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)

	// Deleted, its records go.
	require.NoError(t, f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Delete(context.Background(), "edge", metav1.DeleteOptions{}))
	require.NoError(t, f.syncTarget("edge"))
	_, found, err := refs.LookupSecretRefs(context.Background(), edge.UID, mustDigest(t, edge.Spec))
	require.NoError(t, err)
	require.False(t, found)
}

func mustDigest(t *testing.T, spec any) string {
	t.Helper()
	d, err := authz.SpecDigest(spec)
	require.NoError(t, err)
	return d
}
