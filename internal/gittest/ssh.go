package gittest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// NewSSHKey returns a new ed25519 private key in OpenSSH PEM form, and its signer.
func NewSSHKey(t testing.TB) ([]byte, ssh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "")
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return pem.EncodeToMemory(block), signer
}

// KnownHostsLine is the known_hosts line for addr (host:port) with the host key of signer.
func KnownHostsLine(addr string, host ssh.Signer) []byte {
	return []byte(knownhosts.Line([]string{knownhosts.Normalize(addr)}, host.PublicKey()) + "\n")
}

// SSHServer is an in-process SSH server on a loopback port that runs git-upload-pack and
// git-receive-pack (the git CLI's) on one bare repository, for one client key. It stops when
// the test ends.
type SSHServer struct {
	GitDir  string
	Addr    string // host:port
	HostKey ssh.Signer
	URL     string // ssh://git@<Addr><GitDir>

	mu    sync.Mutex
	execs []string
}

// StartSSHServer serves the bare repository gitDir to the holder of clientKey.
func StartSSHServer(t testing.TB, gitDir string, clientKey ssh.PublicKey) *SSHServer {
	t.Helper()
	_, hostKey := NewSSHKey(t)
	s := &SSHServer{GitDir: gitDir, HostKey: hostKey}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if string(key.Marshal()) != string(clientKey.Marshal()) {
				return nil, errors.New("unknown key")
			}
			return nil, nil
		},
	}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.Addr = ln.Addr().String()
	s.URL = "ssh://git@" + s.Addr + gitDir
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
				s.serve(conn, cfg)
			}()
		}
	}()
	return s
}

// Execs returns the commands the clients asked the server to run, in order.
func (s *SSHServer) Execs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.execs...)
}

func (s *SSHServer) serve(conn net.Conn, cfg *ssh.ServerConfig) {
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
		go s.session(ch, chReqs)
	}
}

// session runs the one exec request of a channel: git-upload-pack or git-receive-pack of the
// repository, nothing else.
func (s *SSHServer) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
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
		s.mu.Lock()
		s.execs = append(s.execs, payload.Command)
		s.mu.Unlock()
		service, arg, _ := strings.Cut(payload.Command, " ")
		if (service != "git-upload-pack" && service != "git-receive-pack") || strings.Trim(arg, "'\"") != s.GitDir {
			_ = req.Reply(false, nil)
			return
		}
		_ = req.Reply(true, nil)
		cmd := exec.Command("git", strings.TrimPrefix(service, "git-"), s.GitDir)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
		status := uint32(0)
		if err := cmd.Run(); err != nil {
			status = 1
		}
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
		return
	}
}
