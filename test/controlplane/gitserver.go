package controlplane

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// GitServer serves Git's smart HTTP protocol over TLS from bare repositories in a directory,
// by running `git http-backend` as a CGI program for each request. Every request needs HTTP
// basic auth with Username and Password; pushes (receive-pack) are enabled. It runs inside
// the test process.
type GitServer struct {
	// Username and Password are the basic-auth credentials, generated at start.
	Username, Password string
	// CAData is the PEM CA bundle that verifies the server's certificate.
	CAData []byte

	root      string // parent directory of the bare repositories
	addr      string // ip:port
	gitPath   string
	logFile   *os.File
	server    *http.Server
	serveDone chan struct{}
	available atomic.Bool
	stopOnce  sync.Once
}

// startGitServer starts the server on a fresh port of 127.0.0.1, serving repositories below
// root and appending the backend's stderr and a line per request to logPath.
func startGitServer(gitPath, root, logPath string, ca *CA) (*GitServer, error) {
	return StartGitServer(gitPath, root, logPath, ca, net.IPv4(127, 0, 0, 1))
}

// StartGitServer is a Git server listening on a fresh port of ip, with a certificate of ca for
// ip, localhost and the loopback addresses: test/cluster's listens on the node's bridge, where
// its Pods reach it.
func StartGitServer(gitPath, root, logPath string, ca *CA, ip net.IP) (*GitServer, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("git server: %w", err)
	}
	certPEM, keyPEM, err := ca.Issue("git-server", []string{"localhost"}, []net.IP{ip, net.IPv4(127, 0, 0, 1), net.IPv6loopback}, false)
	if err != nil {
		return nil, fmt.Errorf("git server: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("git server: %w", err)
	}
	password, err := randomToken()
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("git server: open log: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		logFile.Close()
		return nil, fmt.Errorf("git server: listen: %w", err)
	}
	g := &GitServer{
		Username:  "kubescribe",
		Password:  password,
		CAData:    ca.CertPEM,
		root:      root,
		addr:      ln.Addr().String(),
		gitPath:   gitPath,
		logFile:   logFile,
		serveDone: make(chan struct{}),
	}
	g.available.Store(true)
	g.server = &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:          log.New(logFile, "git server: ", log.LstdFlags),
	}
	go func() {
		defer close(g.serveDone)
		if err := g.server.Serve(tls.NewListener(ln, g.server.TLSConfig)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(g.logFile, "git server stopped: %v\n", err)
		}
	}()
	return g, nil
}

// URL returns the HTTPS clone URL of the repository name: https://<ip>:port/<name>.git.
func (g *GitServer) URL(name string) string {
	return "https://" + g.addr + "/" + name + ".git"
}

// RepoDir returns the directory of the bare repository name.
func (g *GitServer) RepoDir(name string) string {
	return filepath.Join(g.root, name+".git")
}

// CreateRepo creates an empty bare repository whose default branch is main, configured as a
// server that supports partial clone, and returns its directory. name may contain slashes ("org/repo").
func (g *GitServer) CreateRepo(name string) (string, error) {
	if name == "" || strings.Contains(name, "..") || strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("git server: invalid repository name %q", name)
	}
	dir := g.RepoDir(name)
	for _, args := range [][]string{
		{"init", "--quiet", "--bare", "--initial-branch=main", dir},
		{"-C", dir, "config", "http.receivepack", "true"},
		// As servers that support partial clone (GitHub, GitLab) do: fetches may filter out
		// blobs, and ask for objects by id (kubescribe's folder check fetches a folder's blobs).
		{"-C", dir, "config", "uploadpack.allowFilter", "true"},
		{"-C", dir, "config", "uploadpack.allowAnySHA1InWant", "true"},
	} {
		cmd := exec.Command(g.gitPath, args...)
		cmd.Env = gitEnv(g.root)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git server: git %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return dir, nil
}

// SetAvailable(false) makes every request answer 503 Service Unavailable, as if the remote
// had gone away; SetAvailable(true) restores service.
func (g *GitServer) SetAvailable(ok bool) { g.available.Store(ok) }

// Stop closes the server. It is idempotent.
func (g *GitServer) Stop() {
	if g == nil {
		return
	}
	g.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.server.Shutdown(ctx); err != nil {
			g.server.Close()
		}
		<-g.serveDone
		g.logFile.Close()
	})
}

// ServeHTTP checks availability and credentials, then hands the request to git http-backend.
func (g *GitServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	start := time.Now()
	user, _, _ := r.BasicAuth()
	defer func() {
		fmt.Fprintf(g.logFile, "%s %s %s user=%q status=%d %s\n", start.Format(time.RFC3339Nano),
			r.Method, r.URL.RequestURI(), user, rec.status, time.Since(start).Round(time.Millisecond))
	}()
	if !g.available.Load() {
		http.Error(rec, "git server unavailable (SetAvailable(false))", http.StatusServiceUnavailable)
		return
	}
	u, p, ok := r.BasicAuth()
	if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(g.Username)) != 1 ||
		subtle.ConstantTimeCompare([]byte(p), []byte(g.Password)) != 1 {
		rec.Header().Set("WWW-Authenticate", `Basic realm="kubescribe test git"`)
		http.Error(rec, "unauthorized", http.StatusUnauthorized)
		return
	}
	h := &cgi.Handler{
		Path: g.gitPath,
		Args: []string{"http-backend"},
		Dir:  g.root,
		// REMOTE_USER is what makes http-backend allow receive-pack by default.
		Env:    append(gitEnv(g.root), "GIT_PROJECT_ROOT="+g.root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER="+u),
		Stderr: g.logFile,
	}
	h.ServeHTTP(rec, r)
}

// gitEnv isolates git from the user's and the system's configuration.
func gitEnv(home string) []string {
	return []string{"HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
