package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// hostile is text a Git server, or whoever wrote a status, chose: it retitles the terminal,
// clears the screen, sends an 8-bit CSI, and reverses what follows.
const hostile = "\x1b]0;pwned\x07\x1b[2J\u009b31m\u202eevil\x7f\r"

// requireNoControl fails when s holds a control character (but line feed), an escape, a C1
// control or a bidirectional override.
func requireNoControl(t *testing.T, s string) {
	t.Helper()
	i := strings.IndexFunc(s, func(r rune) bool {
		return (r < 0x20 && r != '\n') || r == 0x7f || (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
	})
	require.Equal(t, -1, i, "a control character in the output: %q", s)
	require.NotContains(t, s, `\u001b`, "an escaped ESC, printed again by whoever reads the JSON")
}

// TestDoctorPrintsNoControlCharacters is the attacker's test of what doctor prints: conditions
// and a readiness body carrying escape sequences reach the admin's terminal, text or JSON,
// without a control character.
func TestDoctorPrintsNoControlCharacters(t *testing.T) {
	fx := newDoctorFixture(t)
	fx.ks.setReady(503, "redis: "+hostile)
	fx.providers[0].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonRemoteUnreachable, Message: "listing https://git.example.com/org/repo: " + hostile + strings.Repeat("A", 4096)}}
	fx.targets[0].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonPushFailed, Message: "pushing failed: " + hostile}}

	r, _, out := fx.run(t)
	requireNoControl(t, out)
	require.Contains(t, out, "GitProvider team/repo: RemoteUnreachable: listing https://git.example.com/org/repo: 31mevil")
	require.Contains(t, out, "Pod kubescribe-7c9d: /readyz: redis: 31mevil")

	var buf bytes.Buffer
	require.NoError(t, writeDoctorReport(&buf, "json", r))
	requireNoControl(t, buf.String())
	var decoded doctorReport
	require.NoError(t, json.Unmarshal(buf.Bytes(), &decoded))
	for _, c := range decoded.Checks {
		for _, f := range c.Findings {
			requireNoControl(t, f.Message)
		}
	}
}

// Errors doctor prints on stderr pass the same filter: here a kubeconfig path that carries
// escape sequences, which the error quotes.
func TestDoctorErrorsHaveNoControlCharacters(t *testing.T) {
	var stdout, stderr bytes.Buffer
	path := filepath.Join(t.TempDir(), "kube"+hostile+"config")
	require.NoError(t, os.WriteFile(path, []byte("not: [a kubeconfig"), 0o600))
	code := doctorCmd(context.Background(), []string{"--kubeconfig", path}, &stdout, &stderr)
	require.Equal(t, exitDoctorError, code)
	require.Contains(t, stderr.String(), "kubescribe doctor:")
	requireNoControl(t, stderr.String())
	requireNoControl(t, stdout.String())
}
