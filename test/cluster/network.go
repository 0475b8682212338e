package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The node's network. Everything is fixed: one node per machine.
const (
	// Bridge is the node's own bridge. Its address is the node IP, the apiserver's advertised
	// address and the pods' gateway.
	Bridge = "ksnode0"
	// NodeIP is the bridge's address.
	NodeIP = "10.244.0.1"
	// PodCIDR is the bridge's network; host-local hands out addresses from .10 to .250.
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR holds the ClusterIPs; the kubernetes Service is 10.96.0.1.
	ServiceCIDR = "10.96.0.0/24"
	// APIServerPort is the apiserver's port on NodeIP.
	APIServerPort = 6443

	guardForward = "KUBESCRIBE-NODE-FWD"
	guardOutput  = "KUBESCRIBE-NODE-OUT"
)

// restoredSysctls are the settings the node's parts change on purpose: the kubelet's kernel
// tunables (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory and, if lower, the keys
// quota), IP forwarding (ours, and the bridge plugin's), and what kube-proxy could touch.
// Start puts them back once the node is Ready, and Stop at the end.
var restoredSysctls = []string{
	"kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "vm.panic_on_oom",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward", "net.ipv4.conf.all.forwarding", "net.ipv4.conf.default.forwarding",
	"net.ipv4.conf.all.route_localnet",
	"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables",
	"net.netfilter.nf_conntrack_max",
	"net.netfilter.nf_conntrack_tcp_timeout_established", "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
	"net.netfilter.nf_conntrack_tcp_be_liberal",
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

func writeSysctl(key, value string) error {
	return os.WriteFile(sysctlPath(key), []byte(value+"\n"), 0o644)
}

// restoreSysctls writes back every key of restoredSysctls (and each existing interface's
// IPv4 forwarding switch, which setting net.ipv4.ip_forward flips) whose value differs from
// the snapshot's.
func restoreSysctls(before *HostState) error {
	keys := append([]string(nil), restoredSysctls...)
	for k := range before.Sysctls {
		if strings.HasPrefix(k, "net.ipv4.conf.") && strings.HasSuffix(k, ".forwarding") {
			keys = append(keys, k)
		}
	}
	var e errs
	// ip_forward first: writing it rewrites every interface's forwarding switch.
	for _, k := range keys {
		was, ok := before.Sysctls[k]
		if !ok {
			continue
		}
		now, err := os.ReadFile(sysctlPath(k))
		if err != nil || strings.Join(strings.Fields(string(now)), " ") == was {
			continue
		}
		e.add(writeSysctl(k, was))
	}
	return e.join()
}

// setUpNetwork creates the bridge with the node IP, routes the Service CIDR onto it (so that a
// ClusterIP nobody serves stays on the machine instead of taking the default route), turns on
// forwarding, and puts the guard chains first in FORWARD and OUTPUT:
//
//   - forwarded packets may go from the bridge to the bridge only (pod to pod, pod to Service
//     after DNAT); anything else that enters or leaves through the bridge, or carries a pod or
//     Service address, is dropped, so no pod packet leaves the machine and none comes in;
//   - if the machine did not forward before, nothing else is forwarded now either;
//   - the host's own packets to a pod or Service address leave through the bridge or not at all.
func setUpNetwork(ctx context.Context, before *HostState) error {
	steps := [][]string{
		{"ip", "link", "add", Bridge, "type", "bridge"},
		{"ip", "addr", "add", NodeIP + "/24", "dev", Bridge},
		{"ip", "link", "set", Bridge, "up"},
		{"ip", "route", "add", ServiceCIDR, "dev", Bridge, "src", NodeIP},
		{"iptables", "-w", "-N", guardForward},
		{"iptables", "-w", "-A", guardForward, "-i", Bridge, "-o", Bridge, "-j", "RETURN"},
		{"iptables", "-w", "-A", guardForward, "-i", Bridge, "-j", "DROP"},
		{"iptables", "-w", "-A", guardForward, "-o", Bridge, "-j", "DROP"},
		{"iptables", "-w", "-A", guardForward, "-s", PodCIDR, "-j", "DROP"},
		{"iptables", "-w", "-A", guardForward, "-d", PodCIDR, "-j", "DROP"},
		{"iptables", "-w", "-A", guardForward, "-s", ServiceCIDR, "-j", "DROP"},
		{"iptables", "-w", "-A", guardForward, "-d", ServiceCIDR, "-j", "DROP"},
	}
	if before.Sysctls["net.ipv4.ip_forward"] == "0" {
		steps = append(steps, []string{"iptables", "-w", "-A", guardForward, "-j", "DROP"})
	}
	steps = append(steps,
		[]string{"iptables", "-w", "-I", "FORWARD", "1", "-j", guardForward},
		[]string{"iptables", "-w", "-N", guardOutput},
		[]string{"iptables", "-w", "-A", guardOutput, "-o", "lo", "-j", "RETURN"},
		[]string{"iptables", "-w", "-A", guardOutput, "-d", PodCIDR, "!", "-o", Bridge, "-j", "DROP"},
		[]string{"iptables", "-w", "-A", guardOutput, "-d", ServiceCIDR, "!", "-o", Bridge, "-j", "DROP"},
		[]string{"iptables", "-w", "-I", "OUTPUT", "1", "-j", guardOutput},
	)
	for _, s := range steps {
		if _, err := run(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	// The guard is in place before anything forwards.
	if err := writeSysctl("net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	return writeSysctl("net.bridge.bridge-nf-call-iptables", "1")
}

// tearDownNetwork removes what setUpNetwork and the node's parts added: the pods' veths (if the
// kubelet could not), the route, the bridge, kube-proxy's rules (kube-proxy --cleanup, given as
// cleanup), the kubelet's chains, the guard, and the nf_tables tables iptables made that did
// not exist before.
func tearDownNetwork(ctx context.Context, before *HostState, cleanup func(context.Context) error) error {
	var e errs
	if ifaces, err := os.ReadDir(filepath.Join("/sys/class/net", Bridge, "brif")); err == nil {
		for _, i := range ifaces {
			if _, err := run(ctx, "ip", "link", "del", i.Name()); err != nil {
				e.add(err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", Bridge)); err == nil {
		_, _ = run(ctx, "ip", "route", "del", ServiceCIDR, "dev", Bridge)
		_, err := run(ctx, "ip", "link", "del", Bridge)
		e.add(err)
	}
	if cleanup != nil {
		e.add(cleanup(ctx))
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		e.add(removeChains(ctx, ipt, func(chain string) bool {
			return strings.HasPrefix(chain, "KUBE-") || chain == guardForward || chain == guardOutput
		}))
	}
	e.add(removeNewTables(ctx, before))
	return e.join()
}

// removeChains deletes, in every table, the rules that jump to a chain keep selects and then
// those chains.
func removeChains(ctx context.Context, ipt string, sel func(string) bool) error {
	save := ipt + "-save"
	out, err := run(ctx, save)
	if err != nil {
		return err
	}
	var e errs
	table := ""
	var chains, deletes [][2]string // table, chain / table, rule spec
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			if c := strings.Fields(l[1:])[0]; sel(c) {
				chains = append(chains, [2]string{table, c})
			}
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if sel(f[1]) {
				continue // goes with its chain
			}
			for i, x := range f {
				if (x == "-j" || x == "-g") && i+1 < len(f) && sel(f[i+1]) {
					deletes = append(deletes, [2]string{table, l[len("-A "):]})
					break
				}
			}
		}
	}
	for _, d := range deletes {
		// The spec is the rule as saved; -D with it deletes that rule.
		args := append([]string{"-w", "-t", d[0], "-D"}, splitRule(d[1])...)
		_, err := run(ctx, ipt, args...)
		e.add(err)
	}
	for _, c := range chains {
		_, err := run(ctx, ipt, "-w", "-t", c[0], "-F", c[1])
		e.add(err)
	}
	for _, c := range chains {
		_, err := run(ctx, ipt, "-w", "-t", c[0], "-X", c[1])
		e.add(err)
	}
	return e.join()
}

// splitRule splits a saved rule into arguments, keeping quoted strings (comments) whole.
func splitRule(s string) []string {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			inQuote, have = !inQuote, true
		case c == ' ' && !inQuote:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if have {
		args = append(args, cur.String())
	}
	return args
}

// removeNewTables deletes the nf_tables tables that did not exist before and hold no rule any
// more (iptables-nft creates a table on first use and never removes it).
func removeNewTables(ctx context.Context, before *HostState) error {
	prev, ok := before.Rules["nft list ruleset"]
	if !ok {
		return nil
	}
	out, err := run(ctx, "nft", "list", "tables")
	if err != nil {
		return err
	}
	var e errs
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(l, "table ") || strings.Contains(prev, l+" {") {
			continue
		}
		f := strings.Fields(l) // table <family> <name>
		if len(f) != 3 {
			continue
		}
		content, err := run(ctx, "nft", "list", "table", f[1], f[2])
		if err != nil {
			e.add(err)
			continue
		}
		if tableHasRules(content) {
			e.add(fmt.Errorf("nft table %s %s is new and not empty; left in place", f[1], f[2]))
			continue
		}
		_, err = run(ctx, "nft", "delete", "table", f[1], f[2])
		e.add(err)
	}
	return e.join()
}

// tableHasRules reports whether an `nft list table` output has anything but chain headers.
func tableHasRules(s string) bool {
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "", l == "}", strings.HasPrefix(l, "table "), strings.HasPrefix(l, "chain "),
			strings.HasPrefix(l, "type "):
		default:
			return true
		}
	}
	return false
}
