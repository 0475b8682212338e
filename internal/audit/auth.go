package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// AuthMethod says how a request to the audit endpoint authenticated.
type AuthMethod string

// The ways a caller authenticates.
const (
	AuthNone       AuthMethod = ""
	AuthClientCert AuthMethod = "client-cert"
	AuthToken      AuthMethod = "token"
)

// Authenticator decides whether a request comes from an apiserver allowed to post audit events.
// A request is authenticated when it presents a TLS client certificate the listener verified
// (the listener uses tls.VerifyClientCertIfGiven with the audit client CA), or a bearer token
// equal to one of Tokens. The zero value accepts verified client certificates only.
type Authenticator struct {
	// Tokens are the accepted bearer tokens. They are compared in constant time and never
	// logged.
	Tokens [][]byte
}

// Authenticate reports how r authenticated, or AuthNone and false.
func (a Authenticator) Authenticate(r *http.Request) (AuthMethod, bool) {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return AuthClientCert, true
	}
	token, ok := bearerToken(r)
	if !ok || len(a.Tokens) == 0 {
		return AuthNone, false
	}
	// Compare SHA-256 digests so neither the length nor the content of an accepted token leaks
	// through timing, and look at every token so the position of a match does not either.
	presented := sha256.Sum256(token)
	match := 0
	for _, t := range a.Tokens {
		want := sha256.Sum256(t)
		match |= subtle.ConstantTimeCompare(presented[:], want[:])
	}
	if match == 1 {
		return AuthToken, true
	}
	return AuthNone, false
}

// bearerToken returns the token of an "Authorization: Bearer <token>" header. The scheme is
// case-insensitive (RFC 7235).
func bearerToken(r *http.Request) ([]byte, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, false
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return nil, false
	}
	return []byte(token), true
}

// LoadTokenFile reads the bearer tokens the audit endpoint accepts: one token per line; blank
// lines and lines starting with '#' are ignored, surrounding whitespace is trimmed. A token may
// not contain whitespace. A file without any token is an error. Errors name the file and line,
// never a token.
func LoadTokenFile(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("unable to read audit token file %q: %w", path, err)
	}
	var tokens [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	for line := 1; sc.Scan(); line++ {
		t := bytes.TrimSpace(sc.Bytes())
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		if bytes.ContainsFunc(t, func(r rune) bool { return r == ' ' || r == '\t' || r == '\v' || r == '\f' }) {
			return nil, fmt.Errorf("audit token file %q line %d: a token may not contain whitespace", path, line)
		}
		tokens = append(tokens, bytes.Clone(t))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("unable to read audit token file %q: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("audit token file %q: %w", path, errNoTokens)
	}
	return tokens, nil
}

var errNoTokens = errors.New("no token (one token per line; blank lines and # comments are ignored)")
