package controlplane

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// handedOut holds every port FreePorts has returned in this process. A caller often picks a
// port, lets it go, and binds it only later (a server started after its flags are written, one
// bound again after a restart): the port is free in the meantime, and without this record a
// later pick could hand it out a second time (a CI run's kubescribe found its metrics port taken
// by its own audit listener, both picked by separate FreeAddr calls).
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePorts returns n distinct TCP ports on 127.0.0.1 where nothing listens now. They are
// chosen below the kernel's ephemeral range (net.ipv4.ip_local_port_range), from which it
// picks the local port of every outgoing connection: a server that binds its port again after
// a restart (Redis, the audit endpoint, kubescribe's admission webhook) would otherwise find
// it taken, now and then, by a client's connection. All listeners stay open until every port
// is chosen, and no port this process was handed before is returned again, by this call or
// any later one.
func FreePorts(n int) ([]int, error) {
	lo, hi := fixedPortRange()
	handedOut.Lock()
	defer handedOut.Unlock()
	ports := make([]int, 0, n)
	for range n {
		var l net.Listener
		for try := 0; l == nil; try++ {
			if try > 2000 {
				return nil, fmt.Errorf("pick a free port: every free port was handed out before")
			}
			addr := "127.0.0.1:0"
			if hi > lo && try < 1000 {
				addr = "127.0.0.1:" + strconv.Itoa(lo+rand.IntN(hi-lo))
			}
			var err error
			switch l, err = net.Listen("tcp", addr); {
			case err != nil && addr == "127.0.0.1:0":
				return nil, fmt.Errorf("pick a free port: %w", err)
			case err != nil:
				l = nil // taken: pick another
			case handedOut.ports[l.Addr().(*net.TCPAddr).Port]:
				_ = l.Close() // handed out before, and free again for now
				l = nil
			}
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		handedOut.ports[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// FreeAddr is "127.0.0.1:<port>" of one port of FreePorts.
func FreeAddr() (string, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(ports[0]), nil
}

// PortRangeEnv names the variable that narrows the range FreePorts picks from to "lo-hi"
// (hi excluded), inside the default range. hack/test.sh gives each of the test processes it runs
// at the same time a range of its own: a port one process chose, and left free for a moment (a
// restart, kubescribe stopped for an outage), is never chosen by another.
const PortRangeEnv = "KUBESCRIBE_TEST_PORT_RANGE"

// fixedPortRange is the range [lo, hi) FreePorts picks from: the 16,384 ports below the
// ephemeral range, above the privileged ones, or the part of them PortRangeEnv names. It is
// empty when the ephemeral range starts too low to leave room; FreePorts then takes what the
// kernel hands out.
func fixedPortRange() (lo, hi int) {
	hi = 32768 // Linux's default ephemeral range is 32768-60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	lo = max(hi-16384, 1024)
	if hi-lo < 1024 {
		return 0, 0
	}
	if l, h, ok := narrowedRange(os.Getenv(PortRangeEnv), lo, hi); ok {
		return l, h
	}
	return lo, hi
}

// narrowedRange parses "lo-hi" and reports whether it is a range of at least 256 ports inside
// [min, max). Anything else is ignored: the default range is still safe for one process.
func narrowedRange(v string, min, max int) (lo, hi int, ok bool) {
	a, b, found := strings.Cut(v, "-")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || lo < min || hi > max || hi-lo < 256 {
		return 0, 0, false
	}
	return lo, hi, true
}
