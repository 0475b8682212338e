package git

import (
	"context"
	"errors"
	"fmt"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
)

// ErrAuthentication marks a probe refused for its credentials.
var ErrAuthentication = errors.New("authentication failed")

// Probe checks that the repository at url answers to the credentials by listing its refs. An
// empty repository is reachable. A refusal for the credentials wraps ErrAuthentication; an SSH
// host key that known_hosts does not hold wraps ErrHostKey. The error's text never quotes the
// server (fromRemote): it says what kind of failure it was; RemoteDetail gives the rest, for the
// log.
func Probe(ctx context.Context, url string, creds Credentials) error {
	remote := gogit.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: "origin", URLs: []string{url}})
	auth, err := authFor(url, creds)
	if err != nil {
		return err
	}
	opts := &gogit.ListOptions{CABundle: creds.CABundle, Auth: auth}
	_, err = remote.ListContext(ctx, opts)
	if err == nil || errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return nil
	}
	return fmt.Errorf("listing %s: %w", url, fromRemote(err, creds.redact))
}
