// Command cleanup tears down what a test/cluster node left on this machine when its test binary
// died before Stop (make cluster-clean): for each run directory given, or else each
// $TMPDIR/kubescribe-node-* holding the snapshot Start took and owned by no living process, it
// kills the node's processes, removes its network, rules, mounts and cgroups, restores the
// sysctls, deletes the directory and checks the machine against the snapshot. Start does the
// same by itself before a bring-up; this is for a machine that will not run another node.
package main

import (
	"fmt"
	"os"

	"github.com/kubescribe/kubescribe/test/cluster"
)

func main() {
	dirs := os.Args[1:]
	var err error
	if len(dirs) > 0 {
		err = cluster.Recover(dirs...)
	} else {
		dirs, err = cluster.RecoverAbandoned()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		os.Exit(1)
	}
	if len(dirs) == 0 {
		fmt.Println("cleanup: no node left")
		return
	}
	fmt.Println("cleanup: torn down", dirs)
}
