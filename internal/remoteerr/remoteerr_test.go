package remoteerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/pktline"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/stretchr/testify/require"
)

// marker is what a hostile server writes into every answer.
const marker = "\x1b]0;pwned\x07\x1b[2J SERVER-CHOSEN"

// The failures go-git reports for a Git server are described by kind; none quotes the server.
// (The Kubernetes classes are tested where the controller uses them: TestRemoteErrorClasses.)
func TestDescribeGit(t *testing.T) {
	resp := func(code int) *http.Response {
		return &http.Response{StatusCode: code, Request: &http.Request{URL: &url.URL{Scheme: "https", Host: "git.example.com", Path: "/" + marker}}}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: %s", transport.ErrAuthenticationRequired, marker), AuthenticationFailed},
		{fmt.Errorf("%w: %s", transport.ErrAuthorizationFailed, marker), AccessDenied},
		{fmt.Errorf("%w: %s", transport.ErrRepositoryNotFound, marker), RepositoryNotFound},
		{transport.ErrEmptyRemoteRepository, "the repository is empty"},
		{plumbing.NewUnexpectedError(&githttp.Err{Response: resp(500), Reason: marker}), "server error HTTP 500 (internal server error)"},
		{plumbing.NewUnexpectedError(&githttp.Err{Response: resp(599), Reason: marker}), "server error HTTP 599"},
		{plumbing.NewUnexpectedError(&githttp.Err{Response: resp(418), Reason: marker}), "HTTP 418 (i'm a teapot)"},
		{plumbing.NewUnexpectedError(&url.Error{Op: "Get", URL: "https://x/" + marker, Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}), "connection refused"},
		{fmt.Errorf("listing: %w", &pktline.ErrorLine{Text: marker}), "the Git server refused the request (its message is in kubescribe's log)"},
		{errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain"), AuthenticationFailed},
		{errors.New("ssh: handshake failed: " + marker), "the SSH handshake failed"},
		{fmt.Errorf("ssh: handshake failed: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), "connection reset"},
		{errors.New("ssh: " + marker), "the SSH connection failed"},
		{context.DeadlineExceeded, "timed out"},
		{errors.New(marker), Unusable},
		{plumbing.NewUnexpectedError(errors.New(marker)), Unusable},
		{&plumbing.UnexpectedError{}, Unusable},
	} {
		got := Describe(tc.err)
		require.Equal(t, tc.want, got, "%q", tc.err)
		require.NotContains(t, got, "\x1b")
		require.False(t, strings.Contains(got, "SERVER-CHOSEN") || strings.Contains(got, "pwned"), "%q quotes the server", got)
	}
	require.Empty(t, Describe(nil))
}
