package git

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // hashed known_hosts entries are HMAC-SHA1, as OpenSSH writes them.
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// ErrHostKey marks an SSH remote whose host key is not in known_hosts, or differs from the key
// known_hosts holds for it. Such a host is never trusted.
var ErrHostKey = errors.New("ssh host key rejected")

// knownHost is one host key line of a known_hosts file.
type knownHost struct {
	patterns []string // as written: names, [name]:port, globs, !negations, |1|salt|hash
	key      ssh.PublicKey
	revoked  bool
}

// knownHosts is a known_hosts file parsed in memory: nothing is read from or written to disk.
type knownHosts []knownHost

// parseKnownHosts parses known_hosts content. Lines marked @cert-authority are refused: host
// certificates are not supported. Its errors never quote the content.
func parseKnownHosts(data []byte) (knownHosts, error) {
	var out knownHosts
	rest := data
	for len(bytes.TrimSpace(rest)) > 0 {
		marker, hosts, key, _, next, err := ssh.ParseKnownHosts(rest)
		if err != nil {
			return nil, errors.New("known_hosts does not parse")
		}
		rest = next
		switch marker {
		case "":
		case "revoked":
		default:
			return nil, fmt.Errorf("known_hosts marker @%s is not supported", marker)
		}
		out = append(out, knownHost{patterns: hosts, key: key, revoked: marker == "revoked"})
	}
	if len(out) == 0 {
		return nil, errors.New("known_hosts holds no host key")
	}
	return out, nil
}

// matches reports whether the entry names host, given as known_hosts writes it: "name" for
// port 22, "[name]:port" otherwise (knownhosts.Normalize).
func (k knownHost) matches(host string) bool {
	matched := false
	for _, p := range k.patterns {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(p, "!")
		if !patternMatches(p, host) {
			continue
		}
		if neg {
			return false
		}
		matched = true
	}
	return matched
}

func patternMatches(pattern, host string) bool {
	if strings.HasPrefix(pattern, "|1|") {
		parts := strings.Split(pattern[3:], "|")
		if len(parts) != 2 {
			return false
		}
		salt, err1 := base64.StdEncoding.DecodeString(parts[0])
		want, err2 := base64.StdEncoding.DecodeString(parts[1])
		if err1 != nil || err2 != nil {
			return false
		}
		mac := hmac.New(sha1.New, salt)
		mac.Write([]byte(host))
		return hmac.Equal(mac.Sum(nil), want)
	}
	return wildcardMatch(strings.ToLower(pattern), strings.ToLower(host))
}

// wildcardMatch matches s against an OpenSSH host pattern: '*' is any run of characters, '?'
// any one character, everything else (including '[' and ']') stands for itself.
func wildcardMatch(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if wildcardMatch(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && wildcardMatch(pattern[1:], s[1:])
	default:
		return s != "" && s[0] == pattern[0] && wildcardMatch(pattern[1:], s[1:])
	}
}

// callback checks the host key the server presents. A key is accepted only when a known_hosts
// line names the host with exactly that key and no @revoked line names the key.
func (kh knownHosts) callback(hostname string, remote net.Addr, key ssh.PublicKey) error {
	host := knownhosts.Normalize(hostname)
	wire := key.Marshal()
	known := false
	for _, k := range kh {
		if k.revoked && bytes.Equal(k.key.Marshal(), wire) {
			return hostKeyErrorf("the host key of %s (%s) is marked @revoked in known_hosts", host, ssh.FingerprintSHA256(key))
		}
	}
	for _, k := range kh {
		if k.revoked || !k.matches(host) {
			continue
		}
		known = true
		if bytes.Equal(k.key.Marshal(), wire) {
			return nil
		}
	}
	if known {
		return hostKeyErrorf("the host key of %s (%s %s) does not match known_hosts: the key changed, or someone is intercepting the connection",
			host, key.Type(), ssh.FingerprintSHA256(key))
	}
	return hostKeyErrorf("host %s is not in known_hosts (it offered %s %s); add its key to the Secret's known_hosts",
		host, key.Type(), ssh.FingerprintSHA256(key))
}

// hostKeyError is a refused host key (ErrHostKey), in kubescribe's words only: the host from the
// URL, the key's type and fingerprint. A remote error keeps its text (fromRemote).
type hostKeyError struct{ msg string }

func (e *hostKeyError) Error() string        { return e.msg }
func (e *hostKeyError) Is(target error) bool { return target == ErrHostKey }

func hostKeyErrorf(format string, args ...any) error {
	return &hostKeyError{msg: ErrHostKey.Error() + ": " + fmt.Sprintf(format, args...)}
}

// algorithms are the host key algorithms of the keys known for host, so that the server presents
// one of those rather than another type known_hosts lacks.
func (kh knownHosts) algorithms(hostname string) []string {
	host := knownhosts.Normalize(hostname)
	var out []string
	seen := map[string]bool{}
	add := func(a string) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, k := range kh {
		if k.revoked || !k.matches(host) {
			continue
		}
		if k.key.Type() == ssh.KeyAlgoRSA {
			add(ssh.KeyAlgoRSASHA512)
			add(ssh.KeyAlgoRSASHA256)
		}
		add(k.key.Type())
	}
	return out
}

// sshDialTimeout bounds the TCP connection and SSH handshake of one remote operation.
const sshDialTimeout = 30 * time.Second

// sshAuth authenticates with a private key held in memory and checks the host key against
// known_hosts held in memory. It implements go-git's ssh.AuthMethod; it never prints the key.
type sshAuth struct {
	user   string
	signer ssh.Signer
	hosts  knownHosts
	addr   string // host:port the transport dials
}

func (a *sshAuth) Name() string { return "ssh-public-keys" }

func (a *sshAuth) String() string {
	return fmt.Sprintf("user: %s, name: %s", a.user, a.Name())
}

func (a *sshAuth) ClientConfig() (*ssh.ClientConfig, error) {
	return &ssh.ClientConfig{
		User:              a.user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(a.signer)},
		HostKeyCallback:   a.hosts.callback,
		HostKeyAlgorithms: a.hosts.algorithms(a.addr),
		// go-git dials SSH without the operation's context: bound the connection and handshake.
		Timeout: sshDialTimeout,
	}, nil
}

// sshTarget is the user and host:port of an ssh:// or scp-like URL.
type sshTarget struct {
	user string
	addr string
}

// parseSSHURL splits an ssh:// or scp-like (user@host:path) URL; ok is false for other URLs.
// Its errors never quote the URL.
func parseSSHURL(raw string) (sshTarget, bool, error) {
	if rest, ok := strings.CutPrefix(raw, "ssh://"); ok {
		hostPart, _, _ := strings.Cut(rest, "/")
		user, host, hasUser := strings.Cut(hostPart, "@")
		if !hasUser {
			host, user = user, ""
		}
		if strings.Contains(user, ":") {
			return sshTarget{}, true, errors.New("git: an ssh URL must not carry a password; use the Secret's identity")
		}
		if host == "" {
			return sshTarget{}, true, errors.New("git: Options.URL has no host")
		}
		if _, _, err := net.SplitHostPort(host); err != nil {
			host = net.JoinHostPort(strings.Trim(host, "[]"), "22")
		}
		return sshTarget{user: user, addr: host}, true, nil
	}
	if strings.Contains(raw, "://") {
		return sshTarget{}, false, nil
	}
	// scp-like: [user@]host:path, host possibly [v6].
	user, rest, hasUser := strings.Cut(raw, "@")
	if !hasUser {
		rest, user = user, ""
	}
	var host string
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]:")
		if end < 0 {
			return sshTarget{}, false, nil
		}
		host, rest = rest[1:end], rest[end+2:]
	} else {
		h, p, ok := strings.Cut(rest, ":")
		if !ok {
			return sshTarget{}, false, nil
		}
		host, rest = h, p
	}
	if host == "" || rest == "" || strings.ContainsAny(host, "/") {
		return sshTarget{}, false, nil
	}
	return sshTarget{user: user, addr: net.JoinHostPort(host, "22")}, true, nil
}

// sshAuthFor builds the SSH authentication for url from the credentials: the private key
// (Credentials.SSHKey), known_hosts (Credentials.KnownHosts), and the user of the URL, else
// Credentials.Username, else "git".
func sshAuthFor(t sshTarget, c Credentials) (*sshAuth, error) {
	if len(c.SSHKey) == 0 {
		return nil, errors.New("git: an ssh remote needs Credentials.SSHKey (the Secret's identity)")
	}
	if len(c.KnownHosts) == 0 {
		return nil, errors.New("git: an ssh remote needs Credentials.KnownHosts (the Secret's known_hosts): host keys are never accepted unchecked")
	}
	signer, err := ssh.ParsePrivateKey(c.SSHKey)
	if err != nil {
		var missing *ssh.PassphraseMissingError
		if errors.As(err, &missing) {
			return nil, errors.New("git: the SSH private key is encrypted with a passphrase; use a key without one")
		}
		return nil, errors.New("git: the SSH private key does not parse (PEM or OpenSSH format expected)")
	}
	hosts, err := parseKnownHosts(c.KnownHosts)
	if err != nil {
		return nil, fmt.Errorf("git: %w", err)
	}
	user := t.user
	if user == "" {
		user = c.Username
	}
	if user == "" {
		user = "git"
	}
	return &sshAuth{user: user, signer: signer, hosts: hosts, addr: t.addr}, nil
}
