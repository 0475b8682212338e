package git

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/kubescribe/kubescribe/internal/gittest"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func TestSSHRemote(t *testing.T) {
	keyPEM, key := gittest.NewSSHKey(t)
	gitDir, _ := newBareRemote(t)
	remote := gittest.StartSSHServer(t, gitDir, key.PublicKey())
	_, otherHost := gittest.NewSSHKey(t)
	host, port, err := net.SplitHostPort(remote.Addr)
	require.NoError(t, err)

	tests := []struct {
		name       string
		knownHosts []byte
		wantErr    string
	}{
		{name: "known host key: pushes", knownHosts: gittest.KnownHostsLine(remote.Addr, remote.HostKey)},
		{name: "hashed known_hosts entry", knownHosts: []byte(
			knownhosts.Line([]string{knownhosts.HashHostname(fmt.Sprintf("[%s]:%s", host, port))}, remote.HostKey.PublicKey()) + "\n")},
		{name: "changed host key is refused", knownHosts: gittest.KnownHostsLine(remote.Addr, otherHost),
			wantErr: "does not match known_hosts"},
		{name: "unknown host is refused", knownHosts: gittest.KnownHostsLine("git.example.com:22", remote.HostKey),
			wantErr: "is not in known_hosts"},
		{name: "revoked host key is refused", knownHosts: append(gittest.KnownHostsLine(remote.Addr, remote.HostKey),
			[]byte("@revoked * "+strings.TrimSpace(string(ssh.MarshalAuthorizedKey(remote.HostKey.PublicKey())))+"\n")...),
			wantErr: "marked @revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			branch := strings.NewReplacer(" ", "-", ":", "", "_", "-").Replace(tt.name)
			creds := Credentials{SSHKey: keyPEM, KnownHosts: tt.knownHosts}
			probeErr := Probe(t.Context(), remote.URL, creds)
			opts := testOptions(remote.URL)
			opts.Branch = branch
			opts.CommitWindow = 10 * time.Millisecond
			opts.Credentials = creds
			tw := startWorker(t, opts)
			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
			if tt.wantErr == "" {
				require.NoError(t, probeErr)
				tw.waitPushed(t)
				require.NoError(t, tw.stop(t))
				require.Equal(t, []string{"alice|create configmaps demo/cfg"}, gitLog(t, remote.GitDir, branch, "%an|%s"))
			} else {
				require.ErrorIs(t, probeErr, ErrHostKey)
				require.ErrorContains(t, probeErr, tt.wantErr)
				require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)
				require.ErrorContains(t, tw.Status().LastError, tt.wantErr)
				require.Error(t, tw.stop(t))
				require.Empty(t, runGit(t, "", "--git-dir="+remote.GitDir, "branch", "--list", branch), "nothing reached the remote")
			}
			require.NotContains(t, tw.logs.String(), string(keyPEM))
			require.NotContains(t, tw.logs.String(), "PRIVATE KEY")
		})
	}
	execs := remote.Execs()
	require.NotEmpty(t, execs)
	for _, c := range execs {
		require.Contains(t, []string{"git-upload-pack", "git-receive-pack"}, strings.Fields(c)[0])
	}
}

// A key the server does not know is an authentication failure, and says so.
func TestSSHWrongClientKey(t *testing.T) {
	_, serverKnows := gittest.NewSSHKey(t)
	gitDir, _ := newBareRemote(t)
	remote := gittest.StartSSHServer(t, gitDir, serverKnows.PublicKey())
	wrongPEM, _ := gittest.NewSSHKey(t)
	err := Probe(t.Context(), remote.URL, Credentials{SSHKey: wrongPEM, KnownHosts: gittest.KnownHostsLine(remote.Addr, remote.HostKey)})
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrHostKey)
	require.ErrorIs(t, err, ErrAuthentication)
	require.ErrorContains(t, err, "authentication failed")
	require.Contains(t, RemoteDetail(err), "unable to authenticate", "the SSH library's words, for the log")
	require.NotContains(t, err.Error(), string(wrongPEM))
}

func TestKnownHostsMatching(t *testing.T) {
	_, key := gittest.NewSSHKey(t)
	line := func(patterns string) []byte {
		return []byte(patterns + " " + string(ssh.MarshalAuthorizedKey(key.PublicKey())))
	}
	tests := []struct {
		name       string
		knownHosts []byte
		addr       string
		wantErr    string
	}{
		{name: "plain name, port 22", knownHosts: line("git.example.com"), addr: "git.example.com:22"},
		{name: "plain name does not cover another port", knownHosts: line("git.example.com"), addr: "git.example.com:2222", wantErr: "not in known_hosts"},
		{name: "bracketed port", knownHosts: line("[git.example.com]:2222"), addr: "git.example.com:2222"},
		{name: "wildcard", knownHosts: line("*.example.com"), addr: "git.example.com:22"},
		{name: "negation wins", knownHosts: line("*.example.com,!git.example.com"), addr: "git.example.com:22", wantErr: "not in known_hosts"},
		{name: "case-insensitive", knownHosts: line("GIT.example.com"), addr: "git.example.com:22"},
		{name: "hashed", knownHosts: line(knownhosts.HashHostname("git.example.com")), addr: "git.example.com:22"},
		{name: "other host", knownHosts: line("other.example.com"), addr: "git.example.com:22", wantErr: "not in known_hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kh, err := parseKnownHosts(tt.knownHosts)
			require.NoError(t, err)
			err = kh.callback(tt.addr, nil, key.PublicKey())
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.Contains(t, kh.algorithms(tt.addr), ssh.KeyAlgoED25519)
				return
			}
			require.ErrorIs(t, err, ErrHostKey)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	_, err := parseKnownHosts([]byte("@cert-authority *.example.com " + string(ssh.MarshalAuthorizedKey(key.PublicKey()))))
	require.ErrorContains(t, err, "@cert-authority is not supported")
}
