package cluster

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDockerArchive(t *testing.T) {
	out := filepath.Join(t.TempDir(), "img.tar")
	if err := writeDockerArchive(out, "kubescribe.test/x:1", "65532:65532", "/x", []byte("#!prog")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = b
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
	}
	m := manifest[0]
	if !reflect.DeepEqual(m.RepoTags, []string{"kubescribe.test/x:1"}) || len(m.Layers) != 1 {
		t.Errorf("manifest %+v", m)
	}
	var config struct {
		Config struct {
			Entrypoint []string
			User       string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files[m.Config], &config); err != nil {
		t.Fatal(err)
	}
	if config.Config.User != "65532:65532" || !reflect.DeepEqual(config.Config.Entrypoint, []string{"/x"}) || len(config.RootFS.DiffIDs) != 1 {
		t.Errorf("config %+v", config)
	}
	lr := tar.NewReader(strings.NewReader(string(files[m.Layers[0]])))
	var names []string
	for {
		h, err := lr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if !reflect.DeepEqual(names, []string{"tmp/", "x"}) {
		t.Errorf("layer holds %q", names)
	}
}

func TestRedisImage(t *testing.T) {
	for _, p := range []string{"/usr/bin/redis-server", "/usr/bin/redis-cli", "/bin/busybox"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%v (make deps installs it)", err)
		}
	}
	out := filepath.Join(t.TempDir(), "redis.tar")
	if err := BuildRedisImage(t.Context(), out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// The archive's second entry is the layer.
	tr := tar.NewReader(strings.NewReader(string(b)))
	var layer []byte
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if strings.HasSuffix(h.Name, "/layer.tar") {
			layer, _ = io.ReadAll(tr)
		}
	}
	entries := map[string]*tar.Header{}
	lr := tar.NewReader(strings.NewReader(string(layer)))
	for {
		h, err := lr.Next()
		if err != nil {
			break
		}
		entries[h.Name] = h
	}
	for _, want := range []string{"usr/local/bin/redis-server", "usr/local/bin/redis-cli", "bin/busybox", "data/"} {
		if entries[want] == nil {
			t.Errorf("the layer lacks %s", want)
		}
	}
	loader := false
	for name := range entries {
		loader = loader || strings.Contains(name, "/ld-linux")
	}
	if !loader {
		t.Error("the layer lacks the dynamic loader")
	}
	if h := entries["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("bin/sh: %+v", h)
	}
	if h := entries["data/"]; h != nil && h.Uid != 999 {
		t.Errorf("/data is owned by %d, want 999", h.Uid)
	}
}
