package git

import (
	"context"
	"errors"
	"fmt"
	"strings"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
)

// ErrAuthentication marks a probe refused for its credentials.
var ErrAuthentication = errors.New("authentication failed")

// Probe checks that the repository at url answers to the credentials by listing its refs. An
// empty repository is reachable. A refusal for the credentials wraps ErrAuthentication; an SSH
// host key that known_hosts does not hold wraps ErrHostKey.
func Probe(ctx context.Context, url string, creds Credentials) error {
	remote := gogit.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: "origin", URLs: []string{url}})
	auth, err := authFor(url, creds)
	if err != nil {
		return err
	}
	opts := &gogit.ListOptions{CABundle: creds.CABundle, Auth: auth}
	_, err = remote.ListContext(ctx, opts)
	switch {
	case err == nil, errors.Is(err, transport.ErrEmptyRemoteRepository):
		return nil
	case errors.Is(err, ErrHostKey):
		return fmt.Errorf("listing %s: %w", url, err)
	case errors.Is(err, transport.ErrAuthenticationRequired), errors.Is(err, transport.ErrAuthorizationFailed),
		strings.Contains(err.Error(), "ssh: unable to authenticate"):
		return fmt.Errorf("%w for %s: %v", ErrAuthentication, url, creds.redact(err))
	default:
		return fmt.Errorf("listing %s: %v", url, creds.redact(err))
	}
}
