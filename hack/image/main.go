// Command image builds kubescribe's container image without Docker and without a registry
// (make image). It builds cmd/server and cmd/kubescribe as static binaries, lays them out with a
// CA bundle and the nonroot user (65532) in one layer, and writes an archive that
// `ctr -n k8s.io images import`, `kind load image-archive` and `docker load` accept.
//
// The same commit, Go toolchain and CA bundle give the same image digest: every time stamp is
// SOURCE_DATE_EPOCH (by default the commit's time), and the layer's order, owners and modes are
// fixed. docs/install.md describes the image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := options{}
	flag.StringVar(&o.Repo, "repo", ".", "root of the kubescribe repository to build")
	flag.StringVar(&o.Image, "image", "kubescribe:dev", "image name and tag recorded in the archive")
	flag.StringVar(&o.Out, "out", "bin/kubescribe-image.tar", "archive to write")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the image (its OS is linux)")
	flag.StringVar(&o.CABundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA bundle copied to /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates)")
	flag.StringVar(&o.CACopyright, "ca-copyright", "/usr/share/doc/ca-certificates/copyright", "license of the CA bundle, copied beside it when present")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "image: unexpected arguments:", flag.Args())
		os.Exit(2)
	}
	res, err := build(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	res.print(os.Stdout)
}
