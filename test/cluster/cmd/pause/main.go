// Command pause is the node's sandbox ("pause") image: it holds a pod's namespaces and does
// nothing until it is told to stop. It is built and imported by test/cluster, so that the node
// needs no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
