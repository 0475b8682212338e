// Package git is the branch worker: it turns attributed changes into commits and pushes them.
//
// One Worker is the single writer of one (remote URL, branch). It holds the branch in an
// in-memory go-git repository without worktree, gathers consecutive changes of one author on
// one GitTarget into one commit (the commit window), builds each commit straight in the object
// store by rewriting only the trees on the changed paths, and pushes without force. When the
// remote moved, it fetches and rebuilds its unpushed commits on the new tip; when the remote is
// unreachable, it keeps everything and retries with exponential backoff.
//
// docs/git.md documents the repository layout, the commit format and the push behaviour.
package git
