package git

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/remoteerr"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// serverText is what a hostile Git server answers with: escape sequences that retitle the
// terminal and clear the screen, and 4 KiB of text of its choosing.
var serverText = "\x1b]0;pwned\x07\x1b[2J" + strings.Repeat("SERVER-CHOSEN-TEXT ", 4096/19+1)

func pkt(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

// newHostileRemote serves, over TLS, a Git "smart HTTP" server of an empty repository that
// answers every push by refusing it with serverText as the reason (report-status "ng"), or, when
// status is not 200, answers everything with that status and serverText as the body. It returns
// the repository's URL and the server's CA certificate.
func newHostileRemote(t *testing.T, status int) (string, []byte) {
	t.Helper()
	reason := strings.ReplaceAll(serverText, "\n", " ")[:900] // one pkt-line
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status != http.StatusOK {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, serverText)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		switch {
		case r.URL.Query().Get("service") == "git-upload-pack":
			w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
			_, _ = io.WriteString(w, pkt("# service=git-upload-pack\n")+"0000"+"0000")
		case r.URL.Query().Get("service") == "git-receive-pack":
			w.Header().Set("Content-Type", "application/x-git-receive-pack-advertisement")
			_, _ = io.WriteString(w, pkt("# service=git-receive-pack\n")+"0000"+
				pkt(strings.Repeat("0", 40)+" capabilities^{}\x00report-status\n")+"0000")
		case strings.HasSuffix(r.URL.Path, "/git-receive-pack"):
			w.Header().Set("Content-Type", "application/x-git-receive-pack-result")
			_, _ = io.WriteString(w, pkt("unpack ok\n")+pkt("ng refs/heads/main "+reason+"\n")+"0000")
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL + "/org/repo.git", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// TestWorkerErrorNeverQuotesTheServer is the attacker's test of the text a worker's failures
// carry to GitTarget and CommitRequest conditions (Status().LastError) and to the error Stop
// returns: a server that refuses the push with its own text, or answers every request with an
// HTTP error and its own body. The errors say what kind of failure it was; the server's text is
// only in RemoteDetail (the log's "detail").
func TestWorkerErrorNeverQuotesTheServer(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		want   string
	}{
		{"push refused", http.StatusOK, errPushRefused},
		{"401", http.StatusUnauthorized, remoteerr.AuthenticationFailed},
		{"404", http.StatusNotFound, remoteerr.RepositoryNotFound},
		{"503", http.StatusServiceUnavailable, "server error HTTP 503 (service unavailable)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, ca := newHostileRemote(t, tt.status)
			opts := testOptions(url)
			opts.CommitWindow = 10 * time.Millisecond
			opts.Credentials = Credentials{Username: "robot", Password: "tok-never-printed", CABundle: ca}
			tw := startWorker(t, opts)
			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
			require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond, "%s", tw.logs.String())
			last := tw.Status().LastError
			stopErr := tw.stop(t)
			require.Error(t, stopErr)
			for _, err := range []error{last, stopErr} {
				require.ErrorContains(t, err, tt.want)
				require.NotContains(t, err.Error(), "\x1b")
				require.NotContains(t, err.Error(), "pwned")
				require.NotContains(t, err.Error(), "SERVER-CHOSEN")
			}
			if tt.status == http.StatusOK {
				require.Contains(t, RemoteDetail(last), "SERVER-CHOSEN", "the server's reason is kept for the log")
			}
			require.Contains(t, tw.logs.String(), "detail=")
		})
	}
}

// A remote error matches the sentinels its class stands for, even once redaction flattened the
// error it wraps; a host key refusal keeps kubescribe's own words.
func TestFromRemote(t *testing.T) {
	flatten := func(err error) error { return errors.New(err.Error()) }
	auth := fromRemote(fmt.Errorf("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey]"), flatten)
	require.ErrorIs(t, auth, ErrAuthentication)
	require.EqualError(t, auth, remoteerr.AuthenticationFailed)

	hk := fromRemote(fmt.Errorf("ssh: handshake failed: %w", hostKeyErrorf("host %s is not in known_hosts", "git.example.com:22")), flatten)
	require.ErrorIs(t, hk, ErrHostKey)
	require.EqualError(t, hk, "ssh host key rejected: host git.example.com:22 is not in known_hosts")

	other := fromRemote(errors.New("remote: "+serverText), nil)
	require.EqualError(t, other, remoteerr.Unusable)
	require.NotErrorIs(t, other, ErrAuthentication)
	require.Equal(t, "remote: "+serverText, RemoteDetail(fmt.Errorf("push: %w", other)))
	require.Empty(t, RemoteDetail(errors.New("not remote")))
	require.Same(t, other, fromRemote(other, nil), "classified once")
	require.NoError(t, fromRemote(nil, nil))
}
