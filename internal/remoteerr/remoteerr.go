// Package remoteerr describes the failure of a request to a remote server (a source cluster's
// apiserver, a Git server) for text that users read: status conditions, and through them
// `kubescribe doctor`. It says what kind of failure it was, in kubescribe's own words (an HTTP
// status, the class of a connection or TLS failure, authentication failed, repository not found),
// never text the server chose: a response body, a Status message, a Git "ERR" line, a hook's
// output or an SSH server's stderr. Those may carry anything, terminal escape sequences included,
// and the server is whoever the creator of a GitProvider or a kubeconfig Secret pointed kubescribe
// at. The full error goes to kubescribe's log only.
package remoteerr

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/pktline"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// Fixed descriptions a caller may compare with or build on.
const (
	AuthenticationFailed = "authentication failed"
	AccessDenied         = "access denied (403)"
	RepositoryNotFound   = "repository not found"
	// Unusable is the description of an answer none of the classes fit.
	Unusable = "the server's answer cannot be used"
)

// Describe describes err, the failure of a request to a remote server, for a condition: a fixed
// text, or one built only from numbers (an HTTP status) and kubescribe's own words.
func Describe(err error) string {
	if err == nil {
		return ""
	}
	// go-git hides the cause of an unexpected error from errors.As.
	var unexpected *plumbing.UnexpectedError
	if errors.As(err, &unexpected) {
		if unexpected == nil || unexpected.Err == nil {
			return Unusable // whose Error() would panic
		}
		return Describe(unexpected.Err)
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := int(status.Status().Code)
		switch apierrors.ReasonForError(err) {
		case metav1.StatusReasonUnauthorized:
			return "unauthorized (401)"
		case metav1.StatusReasonForbidden:
			return "forbidden (403)"
		case metav1.StatusReasonNotFound:
			return "not found (404)"
		case metav1.StatusReasonTimeout, metav1.StatusReasonServerTimeout:
			return fmt.Sprintf("the server timed out (%d)", code)
		case metav1.StatusReasonTooManyRequests:
			return "too many requests (429)"
		case metav1.StatusReasonServiceUnavailable:
			return "service unavailable (503)"
		}
		if text := http.StatusText(code); text != "" {
			return fmt.Sprintf("HTTP %d (%s)", code, strings.ToLower(text))
		}
		return fmt.Sprintf("HTTP status %d", code)
	}
	var groups *discovery.ErrGroupDiscoveryFailed
	if errors.As(err, &groups) && len(groups.Groups) > 0 {
		gvs := slices.SortedFunc(maps.Keys(groups.Groups), func(a, b schema.GroupVersion) int { return strings.Compare(a.String(), b.String()) })
		return fmt.Sprintf("discovery of %d API group versions failed, the first: %s", len(gvs), Describe(groups.Groups[gvs[0]]))
	}
	if d, ok := describeGit(err); ok {
		return d
	}
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		alert     tls.AlertError
		verify    *tls.CertificateVerificationError
		dns       *net.DNSError
		netErr    net.Error
	)
	switch {
	case errors.As(err, &unknownCA):
		return "certificate signed by unknown authority"
	case errors.As(err, &hostname):
		return "the server's certificate is not valid for its name"
	case errors.As(err, &invalid):
		return "the server's certificate is not valid (expired, not yet valid, or not for serving)"
	case errors.As(err, &verify):
		return "the server's certificate cannot be verified"
	case errors.As(err, &record):
		return "the server does not speak TLS"
	case errors.As(err, &alert):
		return "the TLS handshake failed (the server refused it)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the host"
	case errors.As(err, &dns):
		if dns.IsNotFound {
			return "the server's host name does not resolve"
		}
		return "the host name lookup failed"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the server closed the connection"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		// net/http's own words (not the server's) for a plain HTTP answer to a TLS hello.
		if urlErr.Err != nil && strings.Contains(urlErr.Err.Error(), "server gave HTTP response to HTTPS client") {
			return "the server does not speak TLS"
		}
		return "the request failed"
	}
	if isSSH(err) {
		return "the SSH connection failed"
	}
	return Unusable
}

// describeGit describes the failures go-git reports for what a Git server answered.
func describeGit(err error) (string, bool) {
	var (
		httpErr *githttp.Err
		errLine *pktline.ErrorLine
	)
	switch {
	case errors.Is(err, transport.ErrAuthenticationRequired):
		return AuthenticationFailed, true
	case errors.Is(err, transport.ErrAuthorizationFailed):
		return AccessDenied, true
	case errors.Is(err, transport.ErrRepositoryNotFound):
		return RepositoryNotFound, true
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return "the repository is empty", true
	case errors.As(err, &httpErr) && httpErr.Response != nil:
		return gitHTTPStatus(httpErr.Response.StatusCode), true
	case errors.As(err, &errLine):
		return "the Git server refused the request (its message is in kubescribe's log)", true
	case errors.Is(err, transport.ErrInvalidAuthMethod):
		return "the credentials do not fit the URL's scheme", true
	}
	// x/crypto/ssh's own words, which the text ends with or carries after its fixed prefix.
	if msg := err.Error(); strings.Contains(msg, "ssh: unable to authenticate") {
		return AuthenticationFailed, true
	} else if strings.Contains(msg, "ssh: handshake failed") && !isNetwork(err) {
		return "the SSH handshake failed", true
	}
	return "", false
}

// isNetwork reports whether err carries a network-level cause Describe classifies itself.
func isNetwork(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// isSSH reports whether err is one of x/crypto/ssh's (they all start with "ssh: ").
func isSSH(err error) bool { return strings.HasPrefix(err.Error(), "ssh: ") }

// gitHTTPStatus describes the HTTP status code a Git server answered with (go-git turns 401, 403
// and 404 into errors of their own): an error of the server (5xx), or the code's name.
func gitHTTPStatus(code int) string {
	text := strings.ToLower(http.StatusText(code))
	prefix := "HTTP"
	if code >= 500 && code <= 599 {
		prefix = "server error HTTP"
	}
	if text == "" {
		return fmt.Sprintf("%s %d", prefix, code)
	}
	return fmt.Sprintf("%s %d (%s)", prefix, code, text)
}
