package main

import (
	"errors"
	"fmt"
	"net/mail"
	"path/filepath"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/object"
)

var errNothingToCommit = errors.New("nothing to commit")

// exportRepo commits the exported folder in the local repository that holds it.
type exportRepo struct {
	repo              *git.Repository
	rel               string // the folder, relative to the worktree root
	author, committer *object.Signature
}

// openExportRepo finds the repository holding dir (dir itself or a parent) and parses the
// signatures, before anything is listed, so a bad flag fails fast.
func openExportRepo(dir, author, committer string) (*exportRepo, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	repo, err := git.PlainOpenWithOptions(abs, &git.PlainOpenOptions{DetectDotGit: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		return nil, fmt.Errorf("--commit: %s is not inside a Git repository (run git init, or leave out --commit)", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("--commit: %w", err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return nil, fmt.Errorf("--commit: %w", err)
	}
	root, err := filepath.EvalSymlinks(wt.Filesystem.Root())
	if err != nil {
		return nil, err
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil {
		return nil, err
	}
	r := &exportRepo{repo: repo, rel: filepath.ToSlash(rel)}
	if r.author, err = signature("--author", author); err != nil {
		return nil, err
	}
	if r.committer, err = signature("--committer", committer); err != nil {
		return nil, err
	}
	if r.committer == nil {
		r.committer = r.author
	}
	if r.author == nil {
		// go-git falls back to user.name and user.email of the Git config; say now if there are none.
		cfg, err := repo.ConfigScoped(config.SystemScope)
		if err != nil {
			return nil, fmt.Errorf("--commit: reading the Git config: %w", err)
		}
		if cfg.User.Name == "" || cfg.User.Email == "" {
			return nil, errors.New(`--commit: the Git config has no user.name and user.email; pass --author "Name <email>"`)
		}
	}
	return r, nil
}

// signature parses "Name <email>"; empty gives nil (go-git then reads the Git config).
func signature(flag, s string) (*object.Signature, error) {
	if s == "" {
		return nil, nil
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name == "" {
		return nil, fmt.Errorf(`%s %q: want "Name <email>"`, flag, s)
	}
	return &object.Signature{Name: a.Name, Email: a.Address}, nil
}

// commit stages the folder and commits it: one commit whatever the number of objects.
func (r *exportRepo) commit(message string) (string, error) {
	wt, err := r.repo.Worktree()
	if err != nil {
		return "", err
	}
	if err := wt.AddWithOptions(&git.AddOptions{Path: r.rel}); err != nil {
		return "", fmt.Errorf("staging %s: %w", r.rel, err)
	}
	now := time.Now()
	opts := &git.CommitOptions{}
	if r.author != nil {
		a, c := *r.author, *r.committer
		a.When, c.When = now, now
		opts.Author, opts.Committer = &a, &c
	}
	sha, err := wt.Commit(message, opts)
	if errors.Is(err, git.ErrEmptyCommit) {
		return "", errNothingToCommit
	}
	if err != nil {
		return "", err
	}
	return sha.String(), nil
}
