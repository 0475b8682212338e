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
