package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// A test image is one static Go program in one layer, written as a docker archive
// (manifest.json, the config, the layer tar): what `ctr images import` reads, and all these
// images need. kubescribe's own image is built by `make image` (hack/image, with
// go-containerregistry, in a module of its own); building these tiny ones with the standard
// library keeps that library out of the main module.

// GoImage describes an image made of one Go program.
type GoImage struct {
	// Name is the image reference, e.g. "kubescribe.test/hello:1". containerd stores it as
	// the normalized name (docker.io/library/… for a bare name), which is what the kubelet
	// looks up for the same reference in a Pod.
	Name string
	// Package is the Go package to build, as `go build` takes it (from Dir).
	Package string
	// Dir is where go build runs; default: the kubescribe module's root.
	Dir string
	// User is the config's user (e.g. "65532:65532"); empty means root.
	User string
}

// BuildGoImage builds img's program (static, CGO_ENABLED=0) and writes its docker archive to
// out. The program is the image's entrypoint, at /<base name of Package>.
func BuildGoImage(ctx context.Context, img GoImage, out string) error {
	dir := img.Dir
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		dir = root
	}
	tmp, err := os.MkdirTemp("", "kubescribe-node-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	name := filepath.Base(img.Package)
	bin := filepath.Join(tmp, name)
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags=-s -w", "-o", bin, img.Package)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", img.Package, err, b)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	return writeDockerArchive(out, img.Name, img.User, "/"+name, prog)
}

// goTool is the go command: the one running this test ($GOROOT/bin/go) if there is one.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// layerFile is one entry of an image's only layer: a regular file (Data), a symbolic link
// (Link) or, with a Path ending in "/", a directory.
type layerFile struct {
	Path string // without the leading "/"
	Mode int64
	UID  int // and GID
	Data []byte
	Link string
}

// imageConfig is what an image's config says about running it.
type imageConfig struct {
	Entrypoint, Cmd, Env []string
	User                 string
}

// writeDockerArchive writes an image whose only file is prog at path (mode 0755), run as user.
func writeDockerArchive(out, ref, user, path string, prog []byte) error {
	return writeImage(out, ref, imageConfig{Entrypoint: []string{path}, User: user, Env: []string{"PATH=/"}},
		[]layerFile{{Path: "tmp/", Mode: 0o1777}, {Path: strings.TrimPrefix(path, "/"), Mode: 0o755, Data: prog}})
}

// writeImage writes a docker archive of one layer holding files, in the order given.
func writeImage(out, ref string, cfg imageConfig, files []layerFile) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		h := &tar.Header{Name: f.Path, Mode: f.Mode, Uid: f.UID, Gid: f.UID, ModTime: epoch}
		switch {
		case strings.HasSuffix(f.Path, "/"):
			h.Typeflag = tar.TypeDir
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerID := hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": cfg.Entrypoint,
			"Cmd":        cfg.Cmd,
			"User":       cfg.User,
			"Env":        cfg.Env,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
		"history": []map[string]any{{"created": epoch.UTC().Format(time.RFC3339), "created_by": "test/cluster"}},
	})
	if err != nil {
		return err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{ref},
		"Layers":   []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	aw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerID + "/layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			f.Close()
			return err
		}
		if _, err := aw.Write(e.data); err != nil {
			f.Close()
			return err
		}
	}
	if err := aw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
