package git

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/kubescribe/kubescribe/internal/watch"
)

// newSSHKey returns a new ed25519 private key in OpenSSH PEM form, and its signer.
func newSSHKey(t testing.TB) ([]byte, ssh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return pem.EncodeToMemory(block), signer
}

// knownHostsLine is the known_hosts line for addr (host:port) with the host key of signer.
func knownHostsLine(t testing.TB, addr string, host ssh.Signer) []byte {
	t.Helper()
	return []byte(knownhosts.Line([]string{knownhosts.Normalize(addr)}, host.PublicKey()) + "\n")
}

// sshRemote is an in-process SSH server that runs git-upload-pack and git-receive-pack on one
// bare repository for one client key.
type sshRemote struct {
	gitDir  string
	addr    string
	hostKey ssh.Signer
	url     string

	mu     sync.Mutex
	execs  []string
	authed int
}

func newSSHRemote(t *testing.T, clientKey ssh.PublicKey) *sshRemote {
	t.Helper()
	gitDir, _ := newBareRemote(t)
	_, hostKey := newSSHKey(t)
	r := &sshRemote{gitDir: gitDir, hostKey: hostKey}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if string(key.Marshal()) != string(clientKey.Marshal()) {
				return nil, errors.New("unknown key")
			}
			r.mu.Lock()
			r.authed++
			r.mu.Unlock()
			return nil, nil
		},
	}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r.addr = ln.Addr().String()
	r.url = "ssh://git@" + r.addr + gitDir
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.serve(conn, cfg)
			}()
		}
	}()
	return r
}

func (r *sshRemote) serve(conn net.Conn, cfg *ssh.ServerConfig) {
	defer func() { _ = conn.Close() }()
	_, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "session only")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			return
		}
		go r.session(ch, chReqs)
	}
}

// session runs the one exec request of a channel: git-upload-pack or git-receive-pack of the
// repository, nothing else.
func (r *sshRemote) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer func() { _ = ch.Close() }()
	for req := range reqs {
		if req.Type != "exec" {
			_ = req.Reply(false, nil)
			continue
		}
		var payload struct{ Command string }
		if err := ssh.Unmarshal(req.Payload, &payload); err != nil {
			_ = req.Reply(false, nil)
			return
		}
		r.mu.Lock()
		r.execs = append(r.execs, payload.Command)
		r.mu.Unlock()
		service, arg, _ := strings.Cut(payload.Command, " ")
		if (service != "git-upload-pack" && service != "git-receive-pack") || strings.Trim(arg, "'\"") != r.gitDir {
			_ = req.Reply(false, nil)
			return
		}
		_ = req.Reply(true, nil)
		cmd := exec.Command("git", strings.TrimPrefix(service, "git-"), r.gitDir)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
		status := uint32(0)
		if err := cmd.Run(); err != nil {
			status = 1
		}
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
		return
	}
}

func TestSSHRemote(t *testing.T) {
	keyPEM, key := newSSHKey(t)
	remote := newSSHRemote(t, key.PublicKey())
	_, otherHost := newSSHKey(t)
	host, port, err := net.SplitHostPort(remote.addr)
	require.NoError(t, err)

	tests := []struct {
		name       string
		knownHosts []byte
		wantErr    string
	}{
		{name: "known host key: pushes", knownHosts: knownHostsLine(t, remote.addr, remote.hostKey)},
		{name: "hashed known_hosts entry", knownHosts: []byte(
			knownhosts.Line([]string{knownhosts.HashHostname(fmt.Sprintf("[%s]:%s", host, port))}, remote.hostKey.PublicKey()) + "\n")},
		{name: "changed host key is refused", knownHosts: knownHostsLine(t, remote.addr, otherHost),
			wantErr: "does not match known_hosts"},
		{name: "unknown host is refused", knownHosts: knownHostsLine(t, "git.example.com:22", remote.hostKey),
			wantErr: "is not in known_hosts"},
		{name: "revoked host key is refused", knownHosts: append(knownHostsLine(t, remote.addr, remote.hostKey),
			[]byte("@revoked * "+strings.TrimSpace(string(ssh.MarshalAuthorizedKey(remote.hostKey.PublicKey())))+"\n")...),
			wantErr: "marked @revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			branch := strings.NewReplacer(" ", "-", ":", "", "_", "-").Replace(tt.name)
			creds := Credentials{SSHKey: keyPEM, KnownHosts: tt.knownHosts}
			probeErr := Probe(t.Context(), remote.url, creds)
			opts := testOptions(remote.url)
			opts.Branch = branch
			opts.CommitWindow = 10 * time.Millisecond
			opts.Credentials = creds
			tw := startWorker(t, opts)
			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
			if tt.wantErr == "" {
				require.NoError(t, probeErr)
				tw.waitPushed(t)
				require.NoError(t, tw.stop(t))
				require.Equal(t, []string{"alice|create configmaps demo/cfg"}, gitLog(t, remote.gitDir, branch, "%an|%s"))
			} else {
				require.ErrorIs(t, probeErr, ErrHostKey)
				require.ErrorContains(t, probeErr, tt.wantErr)
				require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)
				require.ErrorContains(t, tw.Status().LastError, tt.wantErr)
				require.Error(t, tw.stop(t))
				require.Empty(t, runGit(t, "", "--git-dir="+remote.gitDir, "branch", "--list", branch), "nothing reached the remote")
			}
			require.NotContains(t, tw.logs.String(), string(keyPEM))
			require.NotContains(t, tw.logs.String(), "PRIVATE KEY")
		})
	}
	remote.mu.Lock()
	defer remote.mu.Unlock()
	require.NotEmpty(t, remote.execs)
	for _, c := range remote.execs {
		require.Contains(t, []string{"git-upload-pack", "git-receive-pack"}, strings.Fields(c)[0])
	}
}

// A key the server does not know is an authentication failure, and says so.
func TestSSHWrongClientKey(t *testing.T) {
	_, serverKnows := newSSHKey(t)
	remote := newSSHRemote(t, serverKnows.PublicKey())
	wrongPEM, _ := newSSHKey(t)
	err := Probe(t.Context(), remote.url, Credentials{SSHKey: wrongPEM, KnownHosts: knownHostsLine(t, remote.addr, remote.hostKey)})
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrHostKey)
	require.ErrorIs(t, err, ErrAuthentication)
	require.ErrorContains(t, err, "unable to authenticate")
	require.NotContains(t, err.Error(), string(wrongPEM))
}

func TestKnownHostsMatching(t *testing.T) {
	_, key := newSSHKey(t)
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
