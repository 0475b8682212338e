package controller

import (
	"testing"

	"filippo.io/age"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// A GitTarget whose age recipients do not parse is InvalidSpec, naming the bad recipient, and
// is not routed.
func TestSyncTargetRefusesBadAgeRecipients(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), newTarget("web", "git", "main", "", func(t *v1alpha1.GitTarget) {
			t.Spec.Encryption = &v1alpha1.Encryption{Age: []string{"age1notarecipient"}}
		})},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec,
		`spec.encryption.age: age recipient "age1notarecipient"`)
	_, routed := f.router.RouteOf(nn("web"))
	require.False(t, routed)
}

// newRecipient returns a new age X25519 recipient (its identity is not kept: tests here
// encrypt only).
func newRecipient(t *testing.T) string {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	return id.Recipient().String()
}
