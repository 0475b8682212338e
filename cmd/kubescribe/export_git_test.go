package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-git/go-git/v5"
	"github.com/stretchr/testify/require"
)

// isolatedRepo makes a repository in a temporary folder, with no global or system Git config.
func isolatedRepo(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	dir := t.TempDir()
	_, err := git.PlainInit(dir, false)
	require.NoError(t, err)
	return dir
}

func TestExportCommit(t *testing.T) {
	root := isolatedRepo(t)
	folder := filepath.Join(root, "clusters", "prod")
	file := filepath.Join(folder, "demo", "core", "configmaps", "a.yaml")
	require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
	require.NoError(t, os.WriteFile(file, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: demo\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "unrelated.txt"), []byte("not staged\n"), 0o644))

	_, err := openExportRepo(folder, "", "")
	require.ErrorContains(t, err, `pass --author "Name <email>"`, "no author anywhere: said before anything is listed")

	r, err := openExportRepo(folder, "Export Bot <export@example.com>", "")
	require.NoError(t, err)
	require.Equal(t, "clusters/prod", r.rel)
	sha, err := r.commit("Export of test")
	require.NoError(t, err)

	repo, err := git.PlainOpen(root)
	require.NoError(t, err)
	head, err := repo.Head()
	require.NoError(t, err)
	require.Equal(t, sha, head.Hash().String())
	c, err := repo.CommitObject(head.Hash())
	require.NoError(t, err)
	require.Equal(t, "Export Bot", c.Author.Name)
	require.Equal(t, "export@example.com", c.Committer.Email, "the committer defaults to the author")
	tree, err := c.Tree()
	require.NoError(t, err)
	_, err = tree.File("clusters/prod/demo/core/configmaps/a.yaml")
	require.NoError(t, err)
	_, err = tree.File("unrelated.txt")
	require.Error(t, err, "only the exported folder is committed")

	_, err = r.commit("again")
	require.ErrorIs(t, err, errNothingToCommit)
}
