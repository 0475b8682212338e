package controller

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/gittest"
)

const sshRemoteURL = "git@git.example.com:team/config.git"

// newSSHKeyPEM returns a new ed25519 private key (OpenSSH PEM) and its public key.
func newSSHKeyPEM(t *testing.T) (string, ssh.PublicKey) {
	t.Helper()
	key, signer := gittest.NewSSHKey(t)
	return string(key), signer.PublicKey()
}

// An SSH GitProvider reads the private key and known_hosts from its Secret, both required, and
// says which is missing or unusable; a host key the known_hosts does not hold is its own reason.
func TestSyncProviderSSH(t *testing.T) {
	key, _ := newSSHKeyPEM(t)
	_, hostKey := newSSHKeyPEM(t)
	knownHosts := knownhosts.Line([]string{"git.example.com"}, hostKey) + "\n"
	tests := []struct {
		name       string
		url        string
		noSecret   bool
		data       map[string]string
		probeErr   error
		wantReason string
		wantMsg    []string
		wantProbe  bool
	}{
		{name: "ready", data: map[string]string{"identity": key, "known_hosts": knownHosts},
			wantReason: v1alpha1.ReasonReady, wantProbe: true},
		{name: "ssh:// URL with a user", url: "ssh://git@git.example.com:2222/team/config.git",
			data: map[string]string{"identity": key, "known_hosts": knownHosts}, wantReason: v1alpha1.ReasonReady, wantProbe: true},
		{name: "no identity", data: map[string]string{"known_hosts": knownHosts, "password": testPassword},
			wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: []string{`Secret "creds"`, `"identity"`}},
		{name: "no known_hosts", data: map[string]string{"identity": key},
			wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: []string{`"known_hosts"`, "never accepts an SSH host key unchecked"}},
		{name: "identity that does not parse", data: map[string]string{"identity": "not-a-key-" + testPassword, "known_hosts": knownHosts},
			wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: []string{`Secret "creds"`, "private key does not parse"}},
		{name: "known_hosts that does not parse", data: map[string]string{"identity": key, "known_hosts": "git.example.com ssh-ed25519 " + testPassword},
			wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: []string{"known_hosts does not parse"}},
		{name: "host key rejected", data: map[string]string{"identity": key, "known_hosts": knownHosts},
			probeErr:   fmt.Errorf("listing %s: %w: host git.example.com is not in known_hosts", sshRemoteURL, git.ErrHostKey),
			wantReason: v1alpha1.ReasonHostKeyRejected, wantMsg: []string{"not in known_hosts", `Secret "creds"`}, wantProbe: true},
		{name: "no secretRef", noSecret: true, wantReason: v1alpha1.ReasonInvalidSpec, wantMsg: []string{"spec.secretRef", `"identity"`, `"known_hosts"`}},
		{name: "password in the URL", url: "ssh://git:" + testPassword + "@git.example.com/team/config.git",
			data: map[string]string{"identity": key, "known_hosts": knownHosts}, wantReason: v1alpha1.ReasonInvalidSpec, wantMsg: []string{"spec.url"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := tt.url
			if url == "" {
				url = sshRemoteURL
			}
			p := newProvider("git", url)
			cfg := fixtureConfig{objects: []runtime.Object{p}}
			if tt.noSecret {
				p.Spec.SecretRef = nil
			} else {
				cfg.secrets = []runtime.Object{newSecret("creds", tt.data)}
			}
			f := newFixture(t, cfg)
			f.probe.setErr(tt.probeErr)
			require.NoError(t, f.syncProvider("git"))

			got := f.provider("git")
			status := metav1.ConditionFalse
			if tt.wantReason == v1alpha1.ReasonReady {
				status = metav1.ConditionTrue
			}
			cond := requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, status, tt.wantReason, tt.wantMsg...)
			require.NotContains(t, cond.Message, testPassword)
			require.NotContains(t, cond.Message, "PRIVATE KEY")
			calls := f.probe.recorded()
			if !tt.wantProbe {
				require.Empty(t, calls)
				return
			}
			require.Len(t, calls, 1)
			require.Equal(t, url, calls[0].url)
			require.Equal(t, key, string(calls[0].creds.SSHKey))
			require.Equal(t, knownHosts, string(calls[0].creds.KnownHosts))
		})
	}
}
