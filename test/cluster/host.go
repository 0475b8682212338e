package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// HostState is what a node may change on the machine, read before the bring-up and after the
// tear-down: Diff of the two must be empty.
type HostState struct {
	Sysctls  map[string]string // /proc/sys, less the counters that move by themselves
	Links    []string          // network interfaces
	Routes   []string          // ip -4/-6 route show table all
	Rules    map[string]string // iptables-save, ip6tables-save and nft list ruleset, normalized
	Mounts   []string          // mount points with their file system type
	Cgroups  []string          // directories of every cgroup hierarchy, two levels deep
	Netns    []string          // /run/netns
	Paths    []string          // which of hostPaths exist
	Procs    []string          // processes that belong to a node: see ownProcs
	Modules  []string          // loaded kernel modules (reported, never compared: see Diff)
	procMark string            // the marker ownProcs looks for
}

// hostPaths are the places outside the run directory that the node's parts write to despite
// their configuration (containerd's shim sockets in /run/containerd/s, the kubelet's
// /var/log/containers links, libcni's result cache), or would by default.
var hostPaths = []string{
	"/run/containerd", "/var/lib/containerd", "/opt/containerd", "/etc/containerd",
	"/var/lib/cni", "/etc/cni", "/opt/cni", "/run/netns", "/var/run/netns",
	"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/etc/kubernetes",
	"/usr/libexec/kubernetes", "/var/lib/kube-proxy", "/run/kubernetes", "/var/run/kubernetes",
	"/run/mount", // libmount's utab directory, made by the kubelet's mount(8) of a pod's tmpfs
}

// watchedDirs are directories whose entries the check compares, to catch a path that hostPaths
// does not name.
var watchedDirs = []string{"/run", "/var/lib", "/var/log", "/etc", "/opt", "/usr/libexec", "/usr/local/bin"}

// volatileSysctl matches the keys whose values the kernel changes by itself.
var volatileSysctl = regexp.MustCompile(`^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|dqstats\..*|quota\..*)` +
	`|kernel\.(random\..*|ns_last_pid|pty\.nr|perf_event_max_sample_rate|tainted)` +
	`|net\.netfilter\.nf_conntrack_count|net\.ipv4\.route\.flush|net\.ipv6\.route\.flush|vm\.stat_refresh)$`)

// Snapshot reads the host's state. mark is a string only the node's own processes carry on
// their command line (its run directory).
func Snapshot(ctx context.Context, mark string) (*HostState, error) {
	h := &HostState{Sysctls: map[string]string{}, Rules: map[string]string{}, procMark: mark}
	err := filepath.WalkDir("/proc/sys", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		key := strings.ReplaceAll(strings.TrimPrefix(path, "/proc/sys/"), "/", ".")
		if volatileSysctl.MatchString(key) {
			return nil
		}
		if b, err := os.ReadFile(path); err == nil {
			h.Sysctls[key] = strings.Join(strings.Fields(string(b)), " ")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ifaces, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, err
	}
	for _, i := range ifaces {
		h.Links = append(h.Links, i.Name())
	}
	for _, fam := range []string{"-4", "-6"} {
		out, err := run(ctx, "ip", fam, "route", "show", "table", "all")
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l != "" {
				h.Routes = append(h.Routes, l)
			}
		}
	}
	for _, c := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
		if _, err := exec.LookPath(c[0]); err != nil {
			continue
		}
		out, err := run(ctx, c[0], c[1:]...)
		if err != nil {
			return nil, err
		}
		h.Rules[strings.Join(c, " ")] = normalizeRules(out)
	}
	if h.Mounts, err = mounts(); err != nil {
		return nil, err
	}
	for _, m := range h.Mounts {
		f := strings.Fields(m)
		if f[1] != "cgroup" && f[1] != "cgroup2" {
			continue
		}
		for _, d := range dirsBelow(f[0], 2) {
			h.Cgroups = append(h.Cgroups, d)
		}
	}
	if es, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range es {
			h.Netns = append(h.Netns, e.Name())
		}
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil {
			h.Paths = append(h.Paths, p)
		}
	}
	for _, d := range watchedDirs {
		es, _ := os.ReadDir(d)
		for _, e := range es {
			if p := filepath.Join(d, e.Name()); !slices.Contains(h.Paths, p) {
				h.Paths = append(h.Paths, p)
			}
		}
	}
	h.Procs = ownProcs(mark)
	if b, err := os.ReadFile("/proc/modules"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				h.Modules = append(h.Modules, f[0])
			}
		}
	}
	for _, s := range [][]string{h.Links, h.Routes, h.Mounts, h.Cgroups, h.Netns, h.Paths, h.Procs, h.Modules} {
		sort.Strings(s)
	}
	return h, nil
}

var (
	counters = regexp.MustCompile(`\[\d+:\d+\]|packets \d+ bytes \d+`)
	comments = regexp.MustCompile(`(?m)^#.*\n`)
)

// normalizeRules drops what changes without a rule changing: counters and the dump's comments
// (which carry the time).
func normalizeRules(s string) string {
	return counters.ReplaceAllString(comments.ReplaceAllString(s, ""), "")
}

// mounts lists "mountpoint fstype" of this mount namespace.
func mounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		f := strings.Fields(s.Text())
		sep := slices.Index(f, "-")
		if len(f) < 5 || sep < 0 || sep+1 >= len(f) {
			continue
		}
		ms = append(ms, unescapeMount(f[4])+" "+f[sep+1])
	}
	return ms, s.Err()
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// dirsBelow lists the directories under root down to depth levels.
func dirsBelow(root string, depth int) []string {
	var out []string
	var walk func(dir string, level int)
	walk = func(dir string, level int) {
		es, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range es {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			out = append(out, p)
			if level < depth {
				walk(p, level+1)
			}
		}
	}
	walk(root, 1)
	return out
}

// ownProcs lists the processes that belong to a node: those whose command line mentions mark
// (the run directory: every component, containerd's shims, etcd's data dir) and those in a
// kubepods cgroup (the containers). Other engineers' control planes on the same machine run
// etcd and kube-apiserver too; they do not carry the mark.
func ownProcs(mark string) []string {
	es, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range es {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
		if err != nil || len(cmdline) == 0 {
			continue // exited, or a kernel thread
		}
		cmd := strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
		cg, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		if (mark != "" && strings.Contains(cmd, mark)) || strings.Contains(string(cg), "/kubepods") {
			if len(cmd) > 120 {
				cmd = cmd[:120] + "…"
			}
			out = append(out, pid+" "+cmd)
		}
	}
	return out
}

// Diff lists what differs between h (before) and after, one line each. Kernel modules are not
// compared: iptables and the bridge load some (nf_conntrack, br_netfilter, xt_*), which stay
// loaded, as on any machine that ran a firewall once; NewModules names them. Sysctls are
// compared on the keys both have: a module adds keys.
func (h *HostState) Diff(after *HostState) []string {
	var d []string
	for k, v := range h.Sysctls {
		if w, ok := after.Sysctls[k]; ok && w != v {
			d = append(d, fmt.Sprintf("sysctl %s: %q, was %q", k, w, v))
		}
	}
	list := func(what string, before, now []string) {
		for _, x := range now {
			if !slices.Contains(before, x) {
				d = append(d, fmt.Sprintf("%s left: %s", what, x))
			}
		}
		for _, x := range before {
			if !slices.Contains(now, x) {
				d = append(d, fmt.Sprintf("%s gone: %s", what, x))
			}
		}
	}
	list("link", h.Links, after.Links)
	list("route", h.Routes, after.Routes)
	list("mount", h.Mounts, after.Mounts)
	list("cgroup", nodeCgroups(h.Cgroups), nodeCgroups(after.Cgroups))
	list("netns", h.Netns, after.Netns)
	list("path", h.Paths, after.Paths)
	list("process", nil, after.Procs)
	for k, v := range h.Rules {
		if w := after.Rules[k]; w != v {
			d = append(d, fmt.Sprintf("%s differs:\n--- before\n%s\n--- after\n%s", k, v, w))
		}
	}
	sort.Strings(d)
	return d
}

// NewModules lists the kernel modules loaded since h was taken.
func (h *HostState) NewModules(after *HostState) []string {
	var m []string
	for _, x := range after.Modules {
		if !slices.Contains(h.Modules, x) {
			m = append(m, x)
		}
	}
	return m
}

// nodeCgroupMarkers name the cgroups a node's components make: the kubelet's pod hierarchy
// (kubepods, kubepods.slice, and its own if asked to), containerd's and runc's for containers
// started outside a pod (the k8s.io namespace).
var nodeCgroupMarkers = []string{"kubepods", "kubelet", "containerd", "k8s.io", "runc"}

// nodeCgroups keeps the cgroups of cgs a node could have made. The others come and go with the
// machine's other work (a sandbox makes one per process it runs, a systemd one per session): a
// difference there says nothing of the node, and a snapshot older than the machine's last
// restart (Recover's) never matches them.
func nodeCgroups(cgs []string) []string {
	var out []string
	for _, cg := range cgs {
		for _, m := range nodeCgroupMarkers {
			if strings.Contains(cg, m) {
				out = append(out, cg)
				break
			}
		}
	}
	return out
}
