package watch

import (
	"context"
	"crypto/sha256"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
)

// fakeSealer "encrypts" by wrapping the form with a counter, so that two seals of one form
// differ, as SOPS output does.
type fakeSealer struct {
	to []string
	n  atomic.Int64
}

func (f *fakeSealer) Seal(plain []byte) ([]byte, error) {
	return []byte("sealed#" + string(rune('0'+f.n.Add(1))) + " for " + strings.Join(f.to, ",")), nil
}

func (f *fakeSealer) Recipients() []string { return f.to }

// A sealed stream hands over only sealed forms: no declared form and no unkeyed digest of one
// leaves the watch, every change names its recipients, and the cursor records them with what
// was pushed.
func TestSealedStreamHandsOverOnlySealedForms(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("a", "1", map[string]any{"password": "hunter2"}))
	changes, got := streamDemoConfigMaps(t, client, RegistryOptions{Cursors: &fakeCursors{}}, &fakeSealer{to: []string{"age1x"}})
	a := got["a"]
	require.True(t, strings.HasPrefix(string(a.Manifest), "sealed#"), "%s", a.Manifest)
	require.NotContains(t, string(a.Manifest), "hunter2")
	require.Zero(t, a.Digest, "no unkeyed digest of the plaintext")
	require.Equal(t, []string{"age1x"}, a.SealedFor)

	_, err := client.Resource(configMaps).Namespace("demo").Update(context.Background(),
		configMap("a", "2", map[string]any{"password": "correct horse"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	live := nextChange(t, changes)
	require.Equal(t, OpUpdate, live.Op)
	require.NotContains(t, string(live.Manifest), "correct horse")
	require.Zero(t, live.Digest)
	require.Equal(t, []string{"age1x"}, live.SealedFor)
	require.Equal(t, sealPrint([]string{"age1x"}), sealPrint(live.SealedFor))
}

// On resume, an object the cursor shows pushed in its version and sealed for the same
// recipients leaves its file as it is (Unchanged, IfMissing: a new encryption would only
// differ); sealed for other recipients, the committer writes it again (a plain snapshot, which
// needs no author).
func TestSealedResumeKeepsFilesSealedForTheSameRecipients(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("same", "1", map[string]any{"k": "v"}), configMap("other", "2", map[string]any{"k": "v"}))
	to := []string{"age1new"}
	cursors := &fakeCursors{cursors: map[StreamID]Cursor{demoStream: {Known: true, Objects: map[string]CursorEntry{
		"demo/same":  {UID: "uid-same", ResourceVersion: "1", Sealed: sealPrint(to)},
		"demo/other": {UID: "uid-other", ResourceVersion: "2", Sealed: sealPrint([]string{"age1old"})},
	}}}}
	_, got := streamDemoConfigMaps(t, client, RegistryOptions{Cursors: cursors}, &fakeSealer{to: to})
	same := got["same"]
	require.True(t, same.Snapshot && same.Unchanged && same.IfMissing, "%+v", same)
	other := got["other"]
	require.True(t, other.Snapshot, "%+v", other)
	require.False(t, other.Unchanged || other.IfMissing || other.Resumed, "sealed for others: written again by the committer")
	require.Equal(t, to, other.SealedFor)
}

// Against a real Redis, a cursor advanced by a sealed change records its recipients' print.
func TestCursorStoreRecordsSealedFor(t *testing.T) {
	rdb := redistest.Start(t)
	s := NewCursorStore(rdb, keyspace.MustParse("test"))
	c := Change{Cluster: "local", Target: types.NamespacedName{Namespace: "demo", Name: "t"}, GVR: configMaps, Scope: "demo",
		Namespace: "demo", Name: "a", UID: "uid-a", ResourceVersion: "7", Op: OpUpdate, SealedFor: []string{"age1x", "age1y"}}
	require.NoError(t, s.Advance(context.Background(), []Change{c}))
	got, err := s.Load(context.Background(), c.Stream())
	require.NoError(t, err)
	require.Equal(t, CursorEntry{UID: "uid-a", ResourceVersion: "7", Sealed: sealPrint(c.SealedFor)}, got.Objects["demo/a"])
	require.NotEmpty(t, got.Objects["demo/a"].Sealed)
}

// With a digest key, a sealed change carries the keyed digest of its plaintext form, the one
// the admission tier keeps of the write; never the plain SHA-256.
func TestSealedChangeCarriesTheKeyedDigest(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("a", "1", map[string]any{"password": "hunter2"}))
	keyed := func(plain []byte) [32]byte { return sha256.Sum256(append([]byte("key:"), plain...)) }
	_, got := streamDemoConfigMaps(t, client, RegistryOptions{Cursors: &fakeCursors{}, SecretDigest: keyed}, &fakeSealer{to: []string{"age1x"}})
	plain, err := renderData(configMap("a", "1", map[string]any{"password": "hunter2"}))
	require.NoError(t, err)
	require.Equal(t, keyed(plain), got["a"].Digest)
	require.NotEqual(t, sha256.Sum256(plain), got["a"].Digest)
}
