package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// PauseImage is the sandbox image: cmd/pause, built and imported at start.
const PauseImage = "kubescribe.test/pause:1"

// containerd runs with its own configuration, root, state and socket under <run>/containerd;
// /etc/containerd and /var/lib/containerd are never read or written.
func (c *Cluster) containerdConfig() string {
	d := filepath.Join(c.Dir, "containerd")
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
# The opt plugin would create /opt/containerd; the other snapshotters are not used.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = %[3]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  # Root here lacks CAP_SYS_RESOURCE and cannot lower oom_score_adj: without this every
  # sandbox fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[5]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
    max_conf_num = 1
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.containerdSocket(), PauseImage,
		filepath.Join(d, "runc"), c.bins.cniDir, filepath.Join(c.Dir, "cni", "net.d"))
}

func (c *Cluster) containerdSocket() string {
	return filepath.Join(c.Dir, "containerd", "containerd.sock")
}

// cniNetwork is the CNI network's name.
const cniNetwork = "kubescribe-node"

// cniConfig is the pods' network: the bridge plugin on Bridge (created beforehand, with the
// node IP), addresses from host-local with its state under the run directory, no masquerade.
func (c *Cluster) cniConfig() ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": "0.4.0",
		"name":       cniNetwork,
		"plugins": []any{
			map[string]any{
				"type":             "bridge",
				"bridge":           Bridge,
				"isGateway":        true,
				"isDefaultGateway": true,
				"ipMasq":           false,
				"hairpinMode":      true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": filepath.Join(c.Dir, "cni", "ipam"),
					"ranges": [][]map[string]string{{{
						"subnet": PodCIDR, "rangeStart": "10.244.0.10", "rangeEnd": "10.244.0.250", "gateway": NodeIP,
					}}},
				},
			},
		},
	}, "", "  ")
}

// startContainerd writes containerd's and CNI's configuration, starts containerd and waits until
// it answers.
func (c *Cluster) startContainerd(ctx context.Context) error {
	d := filepath.Join(c.Dir, "containerd")
	for _, dir := range []string{d, filepath.Join(c.Dir, "cni", "net.d"), filepath.Join(c.Dir, "cni", "ipam")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	cni, err := c.cniConfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "cni", "net.d", "10-kubescribe-node.conflist"), cni, 0o644); err != nil {
		return err
	}
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(c.containerdConfig()), 0o644); err != nil {
		return err
	}
	p, err := startProc(c.Dir, "containerd", c.bins.containerd, []string{"--config", cfg}, nil)
	if err != nil {
		return err
	}
	c.containerd = p
	return p.wait(ctx, time.Minute, func(ctx context.Context) error {
		_, err := c.ctr(ctx, "version")
		return err
	})
}

// ctr runs ctr against the node's containerd, in the kubelet's namespace k8s.io.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	return run(ctx, c.bins.ctr, append([]string{"--address", c.containerdSocket(), "--namespace", "k8s.io"}, args...)...)
}

// ImportImage imports an image archive (docker or OCI) into the node's containerd, where the
// kubelet finds it: `ctr -n k8s.io images import`. Pods run it with imagePullPolicy Never
// (or IfNotPresent with a tag other than latest).
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	_, err := c.ctr(ctx, "images", "import", archive)
	return err
}

// Images lists the names of the images the node has.
func (c *Cluster) Images(ctx context.Context) ([]string, error) {
	out, err := c.ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// removeContainers kills and deletes every task and container left in containerd, for a
// tear-down after a kubelet that could not stop its pods.
func (c *Cluster) removeContainers(ctx context.Context) error {
	var e errs
	out, err := c.ctr(ctx, "tasks", "ls", "-q")
	if err != nil {
		return err
	}
	for _, id := range strings.Fields(out) {
		_, _ = c.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
	}
	for _, id := range strings.Fields(out) {
		for try := 0; ; try++ {
			_, err := c.ctr(ctx, "tasks", "delete", "--force", id)
			if err == nil || try == 20 {
				e.add(err)
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return e.join()
}
