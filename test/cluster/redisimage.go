package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// RedisImage is the name BuildRedisImage gives its image.
const RedisImage = "kubescribe.test/redis:7-debian"

// BuildRedisImage writes to out an image that stands in for the official redis:7 where no
// registry can be reached: Debian's redis-server and redis-cli with the shared libraries ldd
// names for them, and busybox-static's sh, cat and grep (what deploy/components/redis runs
// besides Redis: its init container's script and its readiness probe). User 999 (the official
// image's redis), /data owned by it.
func BuildRedisImage(ctx context.Context, out string) error {
	files := []layerFile{
		{Path: "bin/"}, {Path: "data/", Mode: 0o755, UID: 999}, {Path: "etc/"}, {Path: "etc/redis/", Mode: 0o755},
		{Path: "tmp/", Mode: 0o1777}, {Path: "usr/"}, {Path: "usr/local/"}, {Path: "usr/local/bin/"},
	}
	for i := range files {
		if files[i].Mode == 0 {
			files[i].Mode = 0o755
		}
	}
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("%w (apt-get install busybox-static)", err)
	}
	files = append(files, layerFile{Path: "bin/busybox", Mode: 0o755, Data: busybox})
	for _, applet := range []string{"sh", "cat", "grep"} {
		files = append(files, layerFile{Path: "bin/" + applet, Mode: 0o777, Link: "busybox"})
	}
	files = append(files, layerFile{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nredis:x:999:999:redis:/data:/bin/sh\n")},
		layerFile{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nredis:x:999:\n")})
	libs := map[string]bool{}
	for _, prog := range []string{"redis-server", "redis-cli"} {
		path, err := filepath.EvalSymlinks("/usr/bin/" + prog)
		if err != nil {
			return fmt.Errorf("%w (apt-get install redis-server)", err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files = append(files, layerFile{Path: "usr/local/bin/" + prog, Mode: 0o755, Data: data})
		out, err := run(ctx, "ldd", path)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				libs[f[2]] = true
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"): // the dynamic loader
				libs[f[0]] = true
			}
		}
	}
	paths := make([]string, 0, len(libs))
	for p := range libs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, p := range paths {
		// Each library where the loader looks for it, with the content of what the path names.
		for d := filepath.Dir(p); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	dirList := make([]string, 0, len(dirs))
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		if d != "/usr" {
			files = append(files, layerFile{Path: strings.TrimPrefix(d, "/") + "/", Mode: 0o755})
		}
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, layerFile{Path: strings.TrimPrefix(p, "/"), Mode: 0o755, Data: data})
	}
	return writeImage(out, RedisImage, imageConfig{
		Cmd:  []string{"redis-server"},
		Env:  []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		User: "999:999",
	}, files)
}
