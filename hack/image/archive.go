package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// imageRef is an image's name in the three spellings the importers want.
type imageRef struct {
	Full     string // docker.io/library/kubescribe:dev: containerd's (and so the kubelet's) name
	Familiar string // kubescribe:dev: docker's
	Tag      string // dev: the OCI layout's ref.name
}

// parseRef reads name[:tag] (the tag defaults to latest). A digest is refused: the archive names
// the image it holds, and its digest is only known once it is built.
func parseRef(s string) (imageRef, error) {
	t, err := name.NewTag(s)
	if err != nil || strings.Contains(s, "@") {
		return imageRef{}, fmt.Errorf("image %q: want name[:tag]", s)
	}
	reg, repo := t.RegistryStr(), t.RepositoryStr()
	r := imageRef{Tag: t.TagStr()}
	if reg == name.DefaultRegistry {
		r.Full = "docker.io/" + repo + ":" + r.Tag
		r.Familiar = strings.TrimPrefix(repo, "library/") + ":" + r.Tag
	} else {
		r.Full = reg + "/" + repo + ":" + r.Tag
		r.Familiar = r.Full
	}
	return r, nil
}

// result describes a written archive.
type result struct {
	Out        string
	Name       string
	Digest     v1.Hash // the manifest's: what containerd lists and a registry would serve
	ImageID    v1.Hash // the config's: what docker lists as IMAGE ID
	Size       int64   // the archive's bytes
	LayerSize  int64   // the compressed layer's bytes
	LayerFiles int64   // the uncompressed layer's bytes
}

func (r result) print(w io.Writer) {
	fmt.Fprintf(w, "wrote %s (%s, %.1f MB; layer %.1f MB compressed, %.1f MB uncompressed)\n",
		r.Out, r.Name, float64(r.Size)/1e6, float64(r.LayerSize)/1e6, float64(r.LayerFiles)/1e6)
	fmt.Fprintf(w, "digest   %s\n", r.Digest)
	fmt.Fprintf(w, "image id %s\n", r.ImageID)
}

// writeArchive writes img to out as a tar that is both an OCI image layout (index.json, blobs/:
// what containerd's importer reads, keeping the manifest and so its digest) and a docker archive
// (manifest.json: what docker load reads), as docker save itself has written since Docker 25.
func writeArchive(out string, img v1.Image, ref imageRef, arch string, epoch int64) (result, error) {
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add: img,
		Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: arch},
			Annotations: map[string]string{
				"io.containerd.image.name":          ref.Full,
				"org.opencontainers.image.ref.name": ref.Tag,
			},
		},
	})
	res := result{Out: out, Name: ref.Full}
	var err error
	if res.Digest, err = img.Digest(); err != nil {
		return res, err
	}
	if res.ImageID, err = img.ConfigName(); err != nil {
		return res, err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	es := []entry{{name: "oci-layout", mode: 0o644, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)}}
	add := func(name string, b []byte, err error) error {
		if err == nil {
			es = append(es, entry{name: name, mode: 0o644, data: b})
		}
		return err
	}
	rawIndex, err := idx.RawManifest()
	if err := add("index.json", rawIndex, err); err != nil {
		return res, err
	}
	rawManifest, err := img.RawManifest()
	if err := add(blob(res.Digest), rawManifest, err); err != nil {
		return res, err
	}
	rawConfig, err := img.RawConfigFile()
	if err := add(blob(res.ImageID), rawConfig, err); err != nil {
		return res, err
	}
	layers, err := img.Layers()
	if err != nil {
		return res, err
	}
	docker := struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{Config: blob(res.ImageID), RepoTags: []string{ref.Familiar}}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return res, err
		}
		b, err := readAll(l.Compressed())
		if err := add(blob(h), b, err); err != nil {
			return res, err
		}
		docker.Layers = append(docker.Layers, blob(h))
		res.LayerSize += int64(len(b))
		n, err := readCount(l.Uncompressed())
		if err != nil {
			return res, err
		}
		res.LayerFiles += n
	}
	rawDocker, err := json.Marshal([]any{docker})
	if err := add("manifest.json", rawDocker, err); err != nil {
		return res, err
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return res, err
	}
	f, err := os.CreateTemp(filepath.Dir(out), ".kubescribe-image-*.tar")
	if err != nil {
		return res, err
	}
	defer os.Remove(f.Name())
	if err := writeTar(f, es, time.Unix(epoch, 0).UTC()); err != nil {
		f.Close()
		return res, err
	}
	if err := f.Close(); err != nil {
		return res, err
	}
	fi, err := os.Stat(f.Name())
	if err != nil {
		return res, err
	}
	res.Size = fi.Size()
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return res, err
	}
	return res, os.Rename(f.Name(), out)
}

func readAll(rc io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func readCount(rc io.ReadCloser, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}
