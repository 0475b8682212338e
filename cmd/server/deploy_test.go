package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/test/deploy"
)

// TestDeployedArgsStart: the arguments each overlay of deploy/ (and of docs/install.md) gives
// kubescribe parse and pass Options.Validate, with the files its Pod would find where the flags
// name them (the mounted Secrets of the build, under a temporary root) and the Redis address of
// its ConfigMap.
func TestDeployedArgsStart(t *testing.T) {
	installs, err := deploy.Installations("../..")
	require.NoError(t, err)
	for overlay, kustomization := range installs {
		t.Run(overlay, func(t *testing.T) {
			objs, err := deploy.BuildOverlay("../..", t.TempDir(), overlay, kustomization)
			require.NoError(t, err)
			dep := deploy.Find(objs, "Deployment", "kubescribe")
			require.NotNil(t, dep)
			files, err := deploy.PodFiles(objs, dep, "kubescribe")
			require.NoError(t, err)
			c, _, err := deploy.Container(dep, "kubescribe")
			require.NoError(t, err)
			addr, err := deploy.EnvFrom(objs, c, "REDIS_ADDR")
			require.NoError(t, err)

			podRoot := t.TempDir()
			for p, b := range files {
				require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(podRoot, p)), 0o700))
				require.NoError(t, os.WriteFile(filepath.Join(podRoot, p), b, 0o600))
			}
			var args []string
			for _, a := range c.Args {
				a = strings.ReplaceAll(a, "$(REDIS_ADDR)", addr)
				a = strings.ReplaceAll(a, "=/etc/kubescribe/", "="+podRoot+"/etc/kubescribe/")
				args = append(args, a)
			}
			opts, _, err := parseFlags(args)
			require.NoError(t, err, "%q", c.Args)
			require.NoError(t, opts.Validate())
			require.NotEmpty(t, opts.RedisPassword)
			require.Equal(t, strings.TrimSpace(string(files["/etc/kubescribe/redis/password"])), opts.RedisPassword)
		})
	}
}
