package controller

import (
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
)

// serverText is what a hostile Git server answers: escape sequences that retitle the terminal and
// clear the screen, and 4 KiB of text of its choosing.
var serverText = "\x1b]0;pwned\x07\x1b[2J" + strings.Repeat("SERVER-CHOSEN-TEXT ", 4096/19+1)

// pktLine frames s as a Git pkt-line.
func pktLine(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

// TestProviderConditionNeverQuotesTheServer is the attacker's test of finding 6: whoever creates
// a GitProvider chooses the server its probe talks to. The real probe (git.Probe) asks an HTTPS
// server (httptest, TLS) that answers each way a server can fail with serverText; the Ready
// condition names the kind of failure only: no ESC, no byte of the server's text.
func TestProviderConditionNeverQuotesTheServer(t *testing.T) {
	for _, tt := range []struct {
		name        string
		status      int
		contentType string
		body        string
		wantReason  string
		wantMsg     string
	}{
		{"401", http.StatusUnauthorized, "text/plain", serverText, v1alpha1.ReasonAuthenticationFailed, "authentication failed"},
		{"403", http.StatusForbidden, "text/plain", serverText, v1alpha1.ReasonAuthenticationFailed, "access denied (403)"},
		{"404", http.StatusNotFound, "text/plain", serverText, v1alpha1.ReasonRemoteUnreachable, "repository not found"},
		{"500", http.StatusInternalServerError, "text/plain", serverText, v1alpha1.ReasonRemoteUnreachable, "server error HTTP 500 (internal server error)"},
		{"502", http.StatusBadGateway, "text/html", serverText, v1alpha1.ReasonRemoteUnreachable, "server error HTTP 502 (bad gateway)"},
		{"200 not Git", http.StatusOK, "text/html", serverText, v1alpha1.ReasonRemoteUnreachable, "the server's answer cannot be used"},
		{"ERR line", http.StatusOK, "application/x-git-upload-pack-advertisement",
			pktLine("# service=git-upload-pack\n") + "0000" + pktLine("ERR "+serverText[:900]), v1alpha1.ReasonRemoteUnreachable, "the Git server refused the request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			srv.Config.ErrorLog = log.New(io.Discard, "", 0)
			srv.StartTLS()
			t.Cleanup(srv.Close)
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

			f := newFixture(t, fixtureConfig{
				objects: []runtime.Object{newProvider("git", srv.URL+"/org/repo.git")},
				secrets: []runtime.Object{newSecret("creds", map[string]string{"password": testPassword, v1alpha1.SecretKeyCACert: string(ca)})},
				probe:   git.Probe,
			})
			_ = f.syncProvider("git") // a retry is asked for unreachable remotes

			got := f.provider("git")
			c := requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, tt.wantReason, tt.wantMsg)
			require.NotContains(t, c.Message, "\x1b", "an escape sequence in the condition")
			require.NotContains(t, c.Message, "pwned")
			require.NotContains(t, c.Message, "SERVER-CHOSEN")
			require.Less(t, len(c.Message), 400, "the message is kubescribe's: %q", c.Message)
			require.Contains(t, f.logs.String(), `msg="a GitProvider's repository check failed"`, "the full error is logged, for the admin")
		})
	}
}
