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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// AuthMethod says how a request authenticated.
type AuthMethod string

// The ways a caller authenticates.
const (
	AuthNone       AuthMethod = ""
	AuthClientCert AuthMethod = "client-cert"
	AuthToken      AuthMethod = "token"
	// AuthAnonymous is a caller without credentials that a listener accepts anyway (the
	// admission listener's insecure opt-out); it is bound to the local route only.
	AuthAnonymous AuthMethod = "anonymous"
)

// Token is a bearer token and the routes it may post to.
type Token struct {
	Value []byte
	// Routes the token is bound to; never empty once loaded.
	Routes []string
	// Line is the token's line in its file, to name it in logs without showing it.
	Line int
}

// Authenticator decides who a caller is and which routes (source clusters) it may speak for.
// It is the one place both the audit endpoint and the admission webhooks bind credentials to
// routes. A caller is authenticated by a TLS client certificate the listener verified (the
// listeners use tls.VerifyClientCertIfGiven with their client CA), or by a token equal to one
// of Tokens. A verified certificate is bound to the routes CertRoutes lists for its Subject
// common name, else to LocalRoute only. The zero value authenticates nobody for any route.
type Authenticator struct {
	// Tokens are the accepted tokens. They are compared in constant time and never logged.
	Tokens []Token
	// TokenFile, when set, holds the accepted tokens instead of Tokens: those of a token
	// file's last content that loaded.
	TokenFile *TokenFile
	// CertRoutes maps the Subject common name of a verified client certificate to its routes.
	CertRoutes map[string][]string
	// LocalRoute is the route of the cluster kubescribe runs in (--cluster-name): the route of
	// a verified certificate without a CertRoutes entry, and of a token-file line without
	// routes.
	LocalRoute string
}

// Caller is an authenticated caller.
type Caller struct {
	Method AuthMethod
	// Name identifies the credential in logs without revealing it: the certificate's common
	// name, or "line N" of the token file.
	Name string
	// Routes the caller may post to.
	Routes []string
}

// MayPost reports whether the caller is bound to route.
func (c Caller) MayPost(route string) bool {
	return c.Method != AuthNone && slices.Contains(c.Routes, route)
}

// Authenticate identifies the caller of r by its verified client certificate, else its
// "Authorization: Bearer" token; false when neither identifies it.
func (a *Authenticator) Authenticate(r *http.Request) (Caller, bool) {
	if c, ok := a.ClientCert(r); ok {
		return c, true
	}
	token, ok := bearerToken(r)
	if !ok {
		return Caller{}, false
	}
	return a.AuthenticateToken(token)
}

// ClientCert identifies the caller of r by the client certificate the listener verified.
func (a *Authenticator) ClientCert(r *http.Request) (Caller, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return Caller{}, false
	}
	cn := r.TLS.VerifiedChains[0][0].Subject.CommonName
	routes, ok := a.CertRoutes[cn]
	if !ok {
		routes = []string{a.LocalRoute}
	}
	return Caller{Method: AuthClientCert, Name: cn, Routes: routes}, true
}

// AuthenticateToken identifies the caller holding token.
func (a *Authenticator) AuthenticateToken(token []byte) (Caller, bool) {
	tokens := a.Tokens
	if a.TokenFile != nil {
		tokens = a.TokenFile.Tokens()
	}
	if len(token) == 0 || len(tokens) == 0 {
		return Caller{}, false
	}
	// Compare SHA-256 digests so neither the length nor the content of an accepted token leaks
	// through timing, and look at every token so the position of a match does not either.
	presented := sha256.Sum256(token)
	match, at := 0, 0
	for i, t := range tokens {
		want := sha256.Sum256(t.Value)
		eq := subtle.ConstantTimeCompare(presented[:], want[:])
		at = subtle.ConstantTimeSelect(eq, i, at)
		match |= eq
	}
	if match != 1 {
		return Caller{}, false
	}
	t := tokens[at]
	return Caller{Method: AuthToken, Name: "line " + strconv.Itoa(t.Line), Routes: t.Routes}, true
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

// LoadTokenFile reads the tokens a listener accepts, one per line: `<token>` or
// `<token> <route>[,<route>...]`. A line with only a token is bound to localRoute; a line with
// routes to those only. Blank lines and lines starting with '#' are ignored, surrounding
// whitespace is trimmed. A file without any token, a route that is not a DNS label and a token
// listed twice are errors. Errors name the file and line, never a token. what names the file in
// errors ("audit token file").
func LoadTokenFile(what, path, localRoute string) ([]Token, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("unable to read %s %q: %w", what, path, err)
	}
	return parseTokens(what, path, localRoute, data)
}

// parseTokens reads the content data of the token file path (LoadTokenFile).
func parseTokens(what, path, localRoute string, data []byte) ([]Token, error) {
	var tokens []Token
	var err error
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	for line := 1; sc.Scan(); line++ {
		l := bytes.TrimSpace(sc.Bytes())
		if len(l) == 0 || l[0] == '#' {
			continue
		}
		fields := bytes.Fields(l)
		if len(fields) > 2 {
			return nil, fmt.Errorf("%s %q line %d: want `<token>` or `<token> <route>[,<route>...]`: a token may not contain whitespace, and routes are separated by commas only", what, path, line)
		}
		t := Token{Value: bytes.Clone(fields[0]), Line: line}
		if len(fields) == 1 {
			t.Routes = []string{localRoute}
		} else if t.Routes, err = parseRoutes(string(fields[1])); err != nil {
			return nil, fmt.Errorf("%s %q line %d: %w", what, path, line, err)
		}
		sum := sha256.Sum256(t.Value)
		if first, ok := seen[sum]; ok {
			return nil, fmt.Errorf("%s %q line %d: the token of line %d is listed again; give all its routes on one line", what, path, line, first)
		}
		seen[sum] = line
		tokens = append(tokens, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("unable to read %s %q: %w", what, path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%s %q: %w", what, path, errNoTokens)
	}
	return tokens, nil
}

// TokenFile is a token file read again when it changes (Reload): its tokens are those of its
// last content that loaded. A content that does not load (a half-written update, a route that
// is not a DNS label) leaves the previous tokens in force.
type TokenFile struct {
	what, path, localRoute string
	tokens                 atomic.Pointer[[]Token]

	mu sync.Mutex
	// seen is the SHA-256 of the content last read, loaded or not: a content is parsed once.
	seen [sha256.Size]byte
}

// OpenTokenFile loads the token file path as LoadTokenFile does, for Reload to follow.
func OpenTokenFile(what, path, localRoute string) (*TokenFile, error) {
	f := &TokenFile{what: what, path: path, localRoute: localRoute}
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Tokens are the tokens in force.
func (f *TokenFile) Tokens() []Token {
	if p := f.tokens.Load(); p != nil {
		return *p
	}
	return nil
}

// Reload reads the file again. It reports whether its tokens changed, and why a changed
// content did not load (once per content; the error names the file and line, never a token).
func (f *TokenFile) Reload() (changed bool, err error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return false, fmt.Errorf("unable to read %s %q: %w", f.what, f.path, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sum := sha256.Sum256(data)
	if sum == f.seen && f.tokens.Load() != nil {
		return false, nil
	}
	f.seen = sum
	tokens, err := parseTokens(f.what, f.path, f.localRoute, data)
	if err != nil {
		return false, err
	}
	f.tokens.Store(&tokens)
	return true, nil
}

// Path is the file's path.
func (f *TokenFile) Path() string { return f.path }

var errNoTokens = errors.New("no token (one `<token> [<route>,...]` per line; blank lines and # comments are ignored)")

// parseRoutes reads a comma-separated list of routes; each must be a DNS label (ValidRoute).
func parseRoutes(s string) ([]string, error) {
	var routes []string
	for _, r := range strings.Split(s, ",") {
		if !ValidRoute(r) {
			return nil, fmt.Errorf("route %q is not a DNS label (lower-case alphanumerics and '-', at most 63 characters)", r)
		}
		if !slices.Contains(routes, r) {
			routes = append(routes, r)
		}
	}
	return routes, nil
}

// ParseCertRoutes reads client-certificate bindings, each `<common name>=<route>[,<route>...]`
// (the last '=' separates them, so a common name may contain '='), into a map for
// Authenticator.CertRoutes. what names the flag in errors.
func ParseCertRoutes(what string, bindings []string) (map[string][]string, error) {
	if len(bindings) == 0 {
		return nil, nil
	}
	m := make(map[string][]string, len(bindings))
	for _, b := range bindings {
		i := strings.LastIndexByte(b, '=')
		if i <= 0 {
			return nil, fmt.Errorf("%s %q: want <common name>=<route>[,<route>...]", what, b)
		}
		cn, list := b[:i], b[i+1:]
		routes, err := parseRoutes(list)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", what, b, err)
		}
		if _, dup := m[cn]; dup {
			return nil, fmt.Errorf("%s: common name %q is bound twice; give all its routes in one binding", what, cn)
		}
		m[cn] = routes
	}
	return m, nil
}
