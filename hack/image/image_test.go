package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestParseRef(t *testing.T) {
	for _, c := range []struct{ in, full, familiar, tag string }{
		{"kubescribe:dev", "docker.io/library/kubescribe:dev", "kubescribe:dev", "dev"},
		{"kubescribe", "docker.io/library/kubescribe:latest", "kubescribe:latest", "latest"},
		{"docker.io/library/kubescribe:v1", "docker.io/library/kubescribe:v1", "kubescribe:v1", "v1"},
		{"someone/kubescribe:v1", "docker.io/someone/kubescribe:v1", "someone/kubescribe:v1", "v1"},
		{"ghcr.io/kubescribe/kubescribe:v0.1.0", "ghcr.io/kubescribe/kubescribe:v0.1.0", "ghcr.io/kubescribe/kubescribe:v0.1.0", "v0.1.0"},
		{"localhost:5000/kubescribe", "localhost:5000/kubescribe:latest", "localhost:5000/kubescribe:latest", "latest"},
	} {
		r, err := parseRef(c.in)
		if err != nil {
			t.Errorf("parseRef(%q): %v", c.in, err)
			continue
		}
		if want := (imageRef{Full: c.full, Familiar: c.familiar, Tag: c.tag}); r != want {
			t.Errorf("parseRef(%q) = %+v, want %+v", c.in, r, want)
		}
	}
	for _, bad := range []string{"", "Kubescribe:dev", "kubescribe:", "kubescribe@sha256:" + strings.Repeat("0", 64)} {
		if r, err := parseRef(bad); err == nil {
			t.Errorf("parseRef(%q) = %+v, want an error", bad, r)
		}
	}
}

// TestAssembleReproducible assembles an image from small stand-ins of the binaries twice: the
// archives are the same bytes, and only the inputs (here the time) change the digest.
func TestAssembleReproducible(t *testing.T) {
	in := rootInputs{Server: []byte("server"), CLI: []byte("cli"), CABundle: []byte("ca"), CACopyright: []byte("MPL-2.0")}
	meta := metadata{Epoch: 1700000000, Revision: strings.Repeat("a", 40), Version: "v0.0.0-test"}
	ref, err := parseRef("kubescribe:dev")
	if err != nil {
		t.Fatal(err)
	}
	write := func(meta metadata) (result, []byte) {
		t.Helper()
		img, err := assemble(rootFS(in), "amd64", meta)
		if err != nil {
			t.Fatal(err)
		}
		res, err := writeArchive(filepath.Join(t.TempDir(), "image.tar"), img, ref, "amd64", meta.Epoch)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(res.Out)
		if err != nil {
			t.Fatal(err)
		}
		return res, b
	}
	r1, b1 := write(meta)
	r2, b2 := write(meta)
	if r1.Digest != r2.Digest || !bytes.Equal(b1, b2) {
		t.Fatalf("two archives of the same inputs differ: %s, %s", r1.Digest, r2.Digest)
	}
	checkArchive(t, r1, ref, meta)

	later := meta
	later.Epoch++
	if r3, _ := write(later); r3.Digest == r1.Digest {
		t.Errorf("another SOURCE_DATE_EPOCH gave the same digest %s", r3.Digest)
	}
}

// TestImageReproducible builds the real image twice, binaries included (from the build cache when
// it holds them), into two places, the second time with a GOFLAGS that would change the binaries
// were it let through: both archives have the same digest and the same bytes.
func TestImageReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubescribe twice")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	o := options{Repo: repo, Image: "kubescribe:dev", Arch: "amd64",
		CABundle: "/etc/ssl/certs/ca-certificates.crt", CACopyright: "/usr/share/doc/ca-certificates/copyright"}
	o1, o2 := o, o
	o1.Out = filepath.Join(t.TempDir(), "one.tar")
	o2.Out = filepath.Join(t.TempDir(), "sub", "two.tar")
	r1, err := build(ctx, o1)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOFLAGS", "-tags=kubescribe_image_test")
	r2, err := build(ctx, o2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s, %d bytes", r1.Name, r1.Digest, r1.Size)
	if r1.Digest != r2.Digest {
		t.Fatalf("two builds of the same commit: digests %s and %s", r1.Digest, r2.Digest)
	}
	b1, err := os.ReadFile(r1.Out)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := os.ReadFile(r2.Out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatal("two builds of the same commit: the archives differ")
	}
	ref, _ := parseRef(o.Image)
	meta, err := gitMetadata(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	files := checkArchive(t, r1, ref, meta)
	for _, p := range []string{serverPath, cliPath} {
		checkStatic(t, p, files[p])
	}
	t.Run("ctr import", func(t *testing.T) { testCtrImport(ctx, t, r1) })
}

// checkArchive reads the archive as containerd (OCI layout) and docker (manifest.json) would and
// checks the image: its config, and a layer with no shell, owned by root but for nonroot's home,
// every time stamp SOURCE_DATE_EPOCH. It returns the layer's files by path.
func checkArchive(t *testing.T, res result, ref imageRef, meta metadata) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	untar(t, res.Out, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(im.Manifests))
	}
	d := im.Manifests[0]
	if d.Digest != res.Digest || d.Annotations["io.containerd.image.name"] != ref.Full ||
		d.Platform == nil || d.Platform.OS != "linux" {
		t.Errorf("index.json's manifest: %+v, want %s named %s for linux", d, res.Digest, ref.Full)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref.Familiar)
	if err != nil {
		t.Fatal(err)
	}
	dockerImg, err := tarball.ImageFromPath(res.Out, &tag)
	if err != nil {
		t.Fatalf("as a docker archive: %v", err)
	}
	for _, i := range []v1.Image{img, dockerImg} {
		if id, err := i.ConfigName(); err != nil || id != res.ImageID {
			t.Errorf("config %s (%v), want %s", id, err, res.ImageID)
		}
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", c.User)
	}
	if want := []string{"/usr/local/bin/kubescribe-server"}; !slices.Equal(c.Entrypoint, want) || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want %q and none", c.Entrypoint, c.Cmd, want)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.source":   sourceURL,
		"org.opencontainers.image.revision": meta.Revision,
		"org.opencontainers.image.version":  meta.Version,
	} {
		if got := c.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	epoch := time.Unix(meta.Epoch, 0).UTC()
	if !cf.Created.Equal(epoch) {
		t.Errorf("created %s, want %s", cf.Created.Time, epoch)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string][]byte{}
	var names []string
	walkTar(t, rc, func(h *tar.Header, r io.Reader) {
		names = append(names, h.Name)
		owner := 0
		if h.Name == "home/nonroot/" {
			owner = 65532
		}
		if h.Uid != owner || h.Gid != owner || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: owner %d:%d (%q:%q), time %s; want %d:%d, %s", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime, owner, owner, epoch)
		}
		if strings.HasPrefix(h.Name, "bin/") || strings.HasPrefix(h.Name, "usr/bin/") || strings.HasPrefix(h.Name, "sbin/") ||
			strings.HasSuffix(h.Name, "/sh") || strings.HasSuffix(h.Name, "busybox") {
			t.Errorf("the image holds %s: no shell, no tools", h.Name)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	})
	if !slices.IsSorted(names) {
		t.Errorf("layer entries not in name order: %q", names)
	}
	if !bytes.Contains(files["etc/passwd"], []byte("\nnonroot:x:65532:65532:")) || !bytes.Contains(files["etc/group"], []byte("\nnonroot:x:65532:")) {
		t.Errorf("no nonroot 65532 in /etc/passwd or /etc/group:\n%s%s", files["etc/passwd"], files["etc/group"])
	}
	for _, p := range []string{serverPath, cliPath, caPath} {
		if len(files[p]) == 0 {
			t.Errorf("%s missing or empty", p)
		}
	}
	return files
}

// checkStatic fails unless b is a Linux executable that needs no dynamic loader or library.
func checkStatic(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s asks for a dynamic loader", p)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("%s needs %q", p, libs)
	}
}

// walkTar calls fn with each entry of the tar r and a reader of its content.
func walkTar(t *testing.T, r io.Reader, fn func(*tar.Header, io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	walkTar(t, f, func(h *tar.Header, r io.Reader) {
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("archive entry %q outside the archive", h.Name)
		}
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			return
		}
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	})
}

// testCtrImport imports the archive with ctr into a throw-away containerd (its own root, state,
// socket and opt directory under a temporary directory; no CRI plugin) and checks the name,
// the digest, and the user a container of it would run as. It needs root and containerd and ctr
// on PATH (Debian's containerd package; docs/install.md), and is skipped without them.
func testCtrImport(ctx context.Context, t *testing.T, res result) {
	containerd, err1 := exec.LookPath("containerd")
	ctrBin, err2 := exec.LookPath("ctr")
	if err1 != nil || err2 != nil || os.Geteuid() != 0 {
		t.Skip("needs root, and containerd and ctr on PATH")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	config := `version = 2
root = "` + filepath.Join(dir, "root") + `"
state = "` + filepath.Join(dir, "state") + `"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "` + sock + `"
[ttrpc]
  address = "` + sock + `.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "` + filepath.Join(dir, "opt") + `"
`
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	daemon := exec.Command(containerd, "--config", filepath.Join(dir, "config.toml"))
	daemon.Stdout, daemon.Stderr = log, log
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = daemon.Process.Signal(os.Interrupt)
		_ = daemon.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("containerd's log:\n%s", b)
		}
	}()
	ctr := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, ctrBin, append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := ctr("version"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer: %v", err)
		}
	}
	if out, err := ctr("images", "import", res.Out); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	out, err := ctr("images", "ls")
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	found := false
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		found = found || len(f) > 2 && f[0] == res.Name && f[2] == res.Digest.String()
	}
	if !found {
		t.Fatalf("ctr lists no %s at %s:\n%s", res.Name, res.Digest, out)
	}
	if out, err := ctr("containers", "create", "--read-only", res.Name, "kubescribe-image-test"); err != nil {
		t.Fatalf("ctr containers create: %v\n%s", err, out)
	}
	out, err = ctr("containers", "info", "kubescribe-image-test")
	if err != nil {
		t.Fatalf("ctr containers info: %v\n%s", err, out)
	}
	var info struct {
		Spec struct {
			Process struct {
				User struct{ UID, GID int }
				Args []string
			}
			Root struct{ Readonly bool }
		}
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("ctr containers info: %v\n%s", err, out)
	}
	p := info.Spec.Process
	if p.User.UID != 65532 || p.User.GID != 65532 || !slices.Equal(p.Args, []string{"/" + serverPath}) || !info.Spec.Root.Readonly {
		t.Errorf("the container would run %q as %d:%d, read-only %v", p.Args, p.User.UID, p.User.GID, info.Spec.Root.Readonly)
	}
}
