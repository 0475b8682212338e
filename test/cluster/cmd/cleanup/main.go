// Command cleanup tears down what a test/cluster node left on this machine when its test binary
// died before Stop (make cluster-clean): for each run directory given, or else each
// $TMPDIR/kubescribe-node-* holding the snapshot Start took, it kills the node's processes,
// removes its network, rules, mounts and cgroups, restores the sysctls, deletes the directory
// and checks the machine against the snapshot.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubescribe/kubescribe/test/cluster"
)

func main() {
	dirs := os.Args[1:]
	if len(dirs) == 0 {
		dirs, _ = filepath.Glob(filepath.Join(os.TempDir(), "kubescribe-node-*", "before.json"))
		for i, d := range dirs {
			dirs[i] = filepath.Dir(d)
		}
	}
	if len(dirs) == 0 {
		fmt.Println("cleanup: no node left")
		return
	}
	if err := cluster.Recover(dirs...); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		os.Exit(1)
	}
	fmt.Println("cleanup: torn down", dirs)
}
