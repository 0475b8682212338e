package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image holds. Paths are relative to its root, as they stand in the layer.
const (
	nonroot     = 65532 // the user and group kubescribe runs as, as in distroless' :nonroot
	serverPath  = "usr/local/bin/kubescribe-server"
	cliPath     = "usr/local/bin/kubescribe"
	caPath      = "etc/ssl/certs/ca-certificates.crt"
	caCopyright = "usr/share/doc/ca-certificates/copyright"
	sourceURL   = "https://github.com/kubescribe/kubescribe"
)

// The go build flags of both binaries. The Dockerfile repeats them: keep the two in step.
var goBuildFlags = []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid="}

type options struct {
	Repo        string // the repository's root
	Image       string // name:tag
	Out         string // the archive
	Arch        string // GOARCH
	CABundle    string
	CACopyright string // optional: skipped when the file does not exist
}

// metadata is what the image says about the source it was built from.
type metadata struct {
	Epoch    int64  // SOURCE_DATE_EPOCH: every time stamp in the image and the archive
	Revision string // the commit
	Version  string // git describe
}

// build builds the binaries from o.Repo and writes the image's archive to o.Out.
func build(ctx context.Context, o options) (result, error) {
	ref, err := parseRef(o.Image)
	if err != nil {
		return result{}, err
	}
	meta, err := gitMetadata(ctx, o.Repo)
	if err != nil {
		return result{}, err
	}
	in := rootInputs{}
	if in.CABundle, err = os.ReadFile(o.CABundle); err != nil {
		return result{}, fmt.Errorf("CA bundle: %w (install Debian's ca-certificates, or name another with -ca-bundle)", err)
	}
	if in.CACopyright, err = os.ReadFile(o.CACopyright); err != nil && !errors.Is(err, os.ErrNotExist) {
		return result{}, err
	}
	tmp, err := os.MkdirTemp("", "kubescribe-image-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(tmp)
	if err := buildBinaries(ctx, o.Repo, o.Arch, tmp); err != nil {
		return result{}, err
	}
	if in.Server, err = os.ReadFile(filepath.Join(tmp, "server")); err != nil {
		return result{}, err
	}
	if in.CLI, err = os.ReadFile(filepath.Join(tmp, "kubescribe")); err != nil {
		return result{}, err
	}
	img, err := assemble(rootFS(in), o.Arch, meta)
	if err != nil {
		return result{}, err
	}
	return writeArchive(o.Out, img, ref, o.Arch, meta.Epoch)
}

// gitMetadata reads the commit of repo: SOURCE_DATE_EPOCH, when set, replaces its time.
func gitMetadata(ctx context.Context, repo string) (metadata, error) {
	git := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
			}
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var m metadata
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		var err error
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return m, err
		}
	}
	var err error
	if m.Epoch, err = strconv.ParseInt(epoch, 10, 64); err != nil || m.Epoch < 0 {
		return m, fmt.Errorf("SOURCE_DATE_EPOCH %q: not a time in seconds since 1970", epoch)
	}
	if m.Revision, err = git("rev-parse", "HEAD"); err != nil {
		return m, err
	}
	if m.Version, err = git("describe", "--tags", "--always", "--dirty"); err != nil {
		return m, err
	}
	return m, nil
}

// buildBinaries builds cmd/server and cmd/kubescribe of repo, static, into dir as server and
// kubescribe.
func buildBinaries(ctx context.Context, repo, arch, dir string) error {
	args := append([]string{"build"}, goBuildFlags...)
	args = append(args, "-o", dir+string(filepath.Separator), "./cmd/server", "./cmd/kubescribe")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	// GOFLAGS is emptied so that a caller's (-race, -tags, -buildvcs) cannot change the binaries.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// rootInputs are the files the image is made of, read from the build machine.
type rootInputs struct {
	Server, CLI, CABundle, CACopyright []byte
}

// entry is one file or directory of a tar: a directory's name ends in "/".
type entry struct {
	name string
	mode int64
	uid  int // and gid
	data []byte
}

// rootFS lays out the image's file system. /tmp is the mount point of the Deployment's emptyDir:
// the image's root file system is meant to be read-only.
func rootFS(in rootInputs) []entry {
	es := []entry{
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		// /etc/hosts before DNS, as glibc's default and distroless do.
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: caPath, mode: 0o644, data: in.CABundle},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot},
		{name: "tmp/", mode: 0o1777},
		{name: serverPath, mode: 0o755, data: in.Server},
		{name: cliPath, mode: 0o755, data: in.CLI},
	}
	if in.CACopyright != nil {
		es = append(es, entry{name: caCopyright, mode: 0o644, data: in.CACopyright})
	}
	return es
}

// writeTar writes es, and every parent directory they leave out (root's, 0755), in name order,
// each stamped with mtime and owned by its uid: nothing of the build machine's files (times,
// owners, modes, order) reaches the tar.
func writeTar(w io.Writer, es []entry, mtime time.Time) error {
	byName := map[string]entry{}
	for _, e := range es {
		byName[e.name] = e
	}
	for _, e := range es {
		for dir := path.Dir(strings.TrimSuffix(e.name, "/")); dir != "."; dir = path.Dir(dir) {
			if _, ok := byName[dir+"/"]; !ok {
				byName[dir+"/"] = entry{name: dir + "/", mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		e := byName[n]
		h := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.uid,
			ModTime: mtime,
			Format:  tar.FormatUSTAR,
		}
		if strings.HasSuffix(n, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("tar %s: %w", n, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("tar %s: %w", n, err)
		}
	}
	return tw.Close()
}

// assemble makes the image: one layer of es, and a config that runs the server as nonroot.
func assemble(es []entry, arch string, meta metadata) (v1.Image, error) {
	created := v1.Time{Time: time.Unix(meta.Epoch, 0).UTC()}
	var layerTar bytes.Buffer
	if err := writeTar(&layerTar, es, created.Time); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression),
		tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: "make image (hack/image)"},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, created
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
		Entrypoint: []string{"/" + serverPath},
		// As in distroless' static image, so that the Dockerfile's image behaves the same.
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=/" + caPath,
		},
		WorkingDir: "/home/nonroot",
		Labels: map[string]string{
			"org.opencontainers.image.source":   sourceURL,
			"org.opencontainers.image.revision": meta.Revision,
			"org.opencontainers.image.version":  meta.Version,
			"org.opencontainers.image.created":  created.Format(time.RFC3339),
		},
	}
	return mutate.ConfigFile(img, cf)
}
