package git

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
)

// fetchRefSpec maps the one remote branch to its remote-tracking reference.
func (w *Worker) fetchRefSpec() config.RefSpec {
	return config.RefSpec(fmt.Sprintf("+%s:%s", w.branch, w.remoteRef))
}

// isMissingBranch reports whether err means the remote has no such branch (or nothing at all),
// so that the branch starts from scratch.
func isMissingBranch(err error) bool {
	return errors.Is(err, transport.ErrEmptyRemoteRepository) ||
		errors.Is(err, gogit.NoMatchingRefSpecError{})
}

// open clones the branch (single branch, no tags, no worktree) into memory. A remote without
// the branch yields an empty repository that knows the remote; the first commit has no parent.
func (w *Worker) open(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	repo, err := gogit.CloneContext(ctx, memory.NewStorage(), nil, &gogit.CloneOptions{
		URL:           w.opts.URL,
		Auth:          w.auth,
		RemoteName:    remoteName,
		ReferenceName: w.branch,
		SingleBranch:  true,
		Tags:          gogit.NoTags,
		CABundle:      w.opts.Credentials.CABundle,
	})
	var tip plumbing.Hash
	switch {
	case err == nil:
		ref, err := repo.Reference(w.remoteRef, true)
		if err != nil {
			return fmt.Errorf("read %s after clone: %w", w.remoteRef, err)
		}
		tip = ref.Hash()
	case isMissingBranch(err):
		repo, err = gogit.Init(memory.NewStorage(), nil)
		if err != nil {
			return err
		}
		if _, err := repo.CreateRemote(&config.RemoteConfig{
			Name:  remoteName,
			URLs:  []string{w.opts.URL},
			Fetch: []config.RefSpec{w.fetchRefSpec()},
		}); err != nil {
			return err
		}
		w.log.Info("remote branch does not exist yet; it starts with the first commit")
	default:
		return err
	}
	w.repo = repo
	w.remoteTip = tip
	w.stale = true
	w.failures, w.retryAt = 0, time.Time{}
	w.setError(nil)
	w.setLocalTip(tip)
	w.log.Info("cloned", "tip", tip.String())
	return nil
}

// refetch fetches the branch after a failed push. It reports whether the local state changed
// so that pushing again makes sense: either the remote moved to a foreign commit (the plans are
// then marked stale, to be rebuilt on it) or the remote already holds some of our commits.
func (w *Worker) refetch(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	remote, err := w.repo.Remote(remoteName)
	if err != nil {
		return false, err
	}
	err = remote.FetchContext(ctx, &gogit.FetchOptions{
		RemoteName: remoteName,
		RefSpecs:   []config.RefSpec{w.fetchRefSpec()},
		Auth:       w.auth,
		Tags:       gogit.NoTags,
		CABundle:   w.opts.Credentials.CABundle,
	})
	var tip plumbing.Hash
	switch {
	case err == nil || errors.Is(err, gogit.NoErrAlreadyUpToDate):
		ref, err := w.repo.Reference(w.remoteRef, true)
		if err != nil {
			return false, fmt.Errorf("read %s after fetch: %w", w.remoteRef, err)
		}
		tip = ref.Hash()
	case isMissingBranch(err):
		return false, nil // the branch is gone: the push creates it again
	default:
		return false, err
	}
	if tip == w.remoteTip {
		return false, nil
	}
	for i, p := range w.plans {
		if p.sha == tip {
			// An earlier push landed although it reported an error.
			w.delivered(i + 1)
			return true, nil
		}
	}
	w.remoteTip = tip
	w.stale = true
	return true, nil
}

// pushOnce pushes the local branch; never forced.
func (w *Worker) pushOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.opTimeout)
	defer cancel()
	remote, err := w.repo.Remote(remoteName)
	if err != nil {
		return err
	}
	return remote.PushContext(ctx, &gogit.PushOptions{
		RemoteName: remoteName,
		RefSpecs:   []config.RefSpec{config.RefSpec(fmt.Sprintf("%s:%s", w.branch, w.branch))},
		Auth:       w.auth,
		CABundle:   w.opts.Credentials.CABundle,
	})
}

// redactedError carries a message with the credentials removed. It deliberately does not
// unwrap: the original text would hold the secret.
type redactedError struct{ msg string }

func (e *redactedError) Error() string { return e.msg }

// redact removes the worker's password from err's message (see Credentials.redact).
func (w *Worker) redact(err error) error { return w.opts.Credentials.redact(err) }

// redact removes the password (plain and URL-escaped) from err's message. Errors that do not
// contain it are returned unchanged, keeping errors.Is/As working.
func (c Credentials) redact(err error) error {
	if err == nil {
		return nil
	}
	pw := c.Password
	if pw == "" {
		return err
	}
	msg := err.Error()
	out := msg
	for _, s := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw)} {
		out = strings.ReplaceAll(out, s, "<redacted>")
	}
	if out == msg {
		return err
	}
	return &redactedError{msg: out}
}
