package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
)

const remoteURL = "https://git.example.com/team/config.git"

// secretValues returns every non-empty value a Secret holds, none of which may appear in a
// status message or a sync error.
func secretValues(s *corev1.Secret) []string {
	if s == nil {
		return nil
	}
	var vals []string
	for _, v := range s.Data {
		if len(v) > 0 {
			vals = append(vals, string(v))
		}
	}
	return vals
}

func TestSyncProvider(t *testing.T) {
	const sshKey = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----\n"
	tests := []struct {
		name     string
		secret   *corev1.Secret // nil: the Secret does not exist
		mutate   func(*v1alpha1.GitProvider)
		probeErr error

		wantStatus metav1.ConditionStatus
		wantReason string
		wantMsg    []string
		// wantRetry: the sync returns an error, so the object is retried with backoff.
		wantRetry bool
		// wantCreds: the remote was probed with these credentials; nil: it was not probed.
		wantCreds *git.Credentials
	}{
		{
			name:       "secret not found",
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonSecretNotFound,
			wantMsg:    []string{`Secret "creds" not found`, `namespace "team-a"`},
			wantRetry:  true,
		},
		{
			name:       "secret without password",
			secret:     newSecret("creds", map[string]string{"username": "robot-user-x1", "ca.crt": "not used"}),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonSecretInvalid,
			wantMsg:    []string{`Secret "creds"`, `"password"`},
		},
		{
			name:       "secret with an empty password",
			secret:     newSecret("creds", map[string]string{"username": "robot-user-x1", "password": ""}),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonSecretInvalid,
			wantMsg:    []string{`"password"`},
		},
		{
			name: "secret with an SSH identity",
			secret: newSecret("creds", map[string]string{
				"identity":    sshKey,
				"known_hosts": "git.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
				"password":    testPassword,
			}),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonSecretInvalid,
			wantMsg:    []string{"SSH", `"identity"`, `Secret "creds"`},
		},
		{
			name:       "remote refuses the credentials",
			secret:     newSecret("creds", map[string]string{"password": testPassword}),
			probeErr:   fmt.Errorf("%w for %s: authorization failed", git.ErrAuthentication, remoteURL),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonAuthenticationFailed,
			wantMsg:    []string{`Secret "creds"`, "authentication failed"},
			wantCreds:  &git.Credentials{Username: v1alpha1.DefaultGitUsername, Password: testPassword},
		},
		{
			name:       "remote unreachable",
			secret:     newSecret("creds", map[string]string{"password": testPassword}),
			probeErr:   errors.New("listing " + remoteURL + ": dial tcp 192.0.2.10:443: connect: connection refused"),
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonRemoteUnreachable,
			wantMsg:    []string{"connection refused"},
			wantRetry:  true,
			wantCreds:  &git.Credentials{Username: v1alpha1.DefaultGitUsername, Password: testPassword},
		},
		{
			name:       "ready, username defaults to git",
			secret:     newSecret("creds", map[string]string{"password": testPassword}),
			wantStatus: metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
			wantMsg:    []string{remoteURL, "reachable"},
			wantCreds:  &git.Credentials{Username: "git", Password: testPassword},
		},
		{
			name:       "ready with the Secret's username",
			secret:     newSecret("creds", map[string]string{"username": "robot-user-x1", "password": testPassword}),
			wantStatus: metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
			wantCreds:  &git.Credentials{Username: "robot-user-x1", Password: testPassword},
		},
		{
			name:       "ready anonymously without secretRef",
			mutate:     func(p *v1alpha1.GitProvider) { p.Spec.SecretRef = nil },
			wantStatus: metav1.ConditionTrue,
			wantReason: v1alpha1.ReasonReady,
			wantCreds:  &git.Credentials{},
		},
		{
			name:   "credentials in the URL are refused without repeating them",
			secret: newSecret("creds", map[string]string{"password": testPassword}),
			mutate: func(p *v1alpha1.GitProvider) {
				p.Spec.URL = "https://robot:" + testPassword + "@git.example.com/team/config.git"
			},
			wantStatus: metav1.ConditionFalse,
			wantReason: v1alpha1.ReasonInvalidSpec,
			wantMsg:    []string{"spec.url"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider("git", remoteURL)
			if tt.mutate != nil {
				tt.mutate(p)
			}
			cfg := fixtureConfig{objects: []runtime.Object{p}}
			if tt.secret != nil {
				cfg.secrets = []runtime.Object{tt.secret}
			}
			f := newFixture(t, cfg)
			f.probe.setErr(tt.probeErr)

			err := f.syncProvider("git")
			if tt.wantRetry {
				require.Error(t, err)
				require.NotContains(t, err.Error(), testPassword)
				for _, v := range secretValues(tt.secret) {
					require.NotContains(t, err.Error(), v, "the sync error leaks a Secret value")
				}
			} else {
				require.NoError(t, err)
			}

			got := f.provider("git")
			cond := requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, tt.wantStatus, tt.wantReason, tt.wantMsg...)
			for _, v := range secretValues(tt.secret) {
				require.NotContains(t, cond.Message, v, "the status message leaks a Secret value")
			}

			calls := f.probe.recorded()
			if tt.wantCreds == nil {
				require.Empty(t, calls, "the remote must not be probed")
			} else {
				require.Len(t, calls, 1)
				require.Equal(t, remoteURL, calls[0].url)
				require.Equal(t, tt.wantCreds.Username, calls[0].creds.Username)
				require.Equal(t, tt.wantCreds.Password, calls[0].creds.Password)
			}

			f.c.mu.RLock()
			state, known := f.c.providers[nn("git")]
			ready := f.c.providerReady[nn("git")]
			f.c.mu.RUnlock()
			require.Equal(t, tt.wantStatus == metav1.ConditionTrue, ready, "provider marked Ready for its targets")
			require.Equal(t, ready, known, "settings are kept once a check passed")
			if ready {
				require.Equal(t, remoteURL, state.URL)
				require.Equal(t, *tt.wantCreds, state.Credentials)
				require.Equal(t, git.Signature{Name: v1alpha1.DefaultCommitterName, Email: v1alpha1.DefaultCommitterEmail}, state.Committer)
				require.Equal(t, v1alpha1.DefaultAuthorEmailDomain, state.AuthorEmailDomain)
			}
		})
	}
}

// TestSyncProviderLosesReadiness walks one provider through Ready and back. A failed check
// marks it not Ready but keeps the last settings that worked (workers holding unpushed commits
// go on with them); deleting the provider forgets them.
func TestSyncProviderLosesReadiness(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL)},
		secrets: []runtime.Object{newSecret("creds", map[string]string{"password": testPassword})},
	})
	ready := func() bool {
		f.c.mu.RLock()
		defer f.c.mu.RUnlock()
		return f.c.providerReady[nn("git")]
	}

	require.NoError(t, f.syncProvider("git"))
	p := f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.True(t, ready())
	worked := f.settings("git")
	require.NotNil(t, worked)

	// The Secret is deleted: read with a GET on each sync, so the next sync notices.
	require.NoError(t, f.kube.CoreV1().Secrets(testNS).Delete(context.Background(), "creds", metav1.DeleteOptions{}))
	require.Error(t, f.syncProvider("git"))
	p = f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound,
		"last settings that worked")
	require.False(t, ready())
	require.Same(t, worked, f.settings("git"), "the last settings that worked are kept")

	// Restored, then the remote goes away.
	_, err := f.kube.CoreV1().Secrets(testNS).Create(context.Background(), newSecret("creds", map[string]string{"password": testPassword}), metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncProvider("git"))
	require.True(t, ready())
	f.probe.setErr(errors.New("listing " + remoteURL + ": 503 Service Unavailable"))
	require.Error(t, f.syncProvider("git"))
	p = f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonRemoteUnreachable, "503")
	require.False(t, ready())
	require.NotNil(t, f.settings("git"))

	// The provider is deleted: its settings go, and the sync of a missing object succeeds.
	require.NoError(t, f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Delete(context.Background(), "git", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, exists, _ := f.c.informers[kindProvider].GetIndexer().GetByKey(nn("git").String())
		return !exists
	}, 5*time.Second, 5*time.Millisecond)
	f.probe.setErr(nil)
	require.NoError(t, f.syncProvider("git"))
	require.False(t, ready())
	require.Nil(t, f.settings("git"))
}

// TestSyncProviderRejectsUnparsableCABundle: the API documents SecretInvalid for "an unparsable
// ca.crt", and the git worker refuses one.
func TestSyncProviderRejectsUnparsableCABundle(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL)},
		secrets: []runtime.Object{newSecret("creds", map[string]string{"password": testPassword, "ca.crt": "this is not PEM"})},
	})
	require.NoError(t, f.syncProvider("git"))
	p := f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretInvalid, `"ca.crt"`)
}

// TestSyncProviderAnonymousAuthFailureMessage: a repository that refuses anonymous access is
// reported without naming a Secret the provider does not have.
func TestSyncProviderAnonymousAuthFailureMessage(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL, func(p *v1alpha1.GitProvider) { p.Spec.SecretRef = nil })},
	})
	f.probe.setErr(fmt.Errorf("%w for %s: authentication required", git.ErrAuthentication, remoteURL))
	require.NoError(t, f.syncProvider("git"))
	p := f.provider("git")
	c := requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonAuthenticationFailed)
	require.NotContains(t, c.Message, `Secret ""`)
}
