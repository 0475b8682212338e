package controlplane

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ports are distinct, free, and out of the range the kernel hands to outgoing connections.
func TestFreePortsAreBelowTheEphemeralRange(t *testing.T) {
	lo, hi := fixedPortRange()
	if hi == 0 {
		t.Skip("the ephemeral range leaves no room below it")
	}
	ports, err := FreePorts(20)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ports {
		require.False(t, seen[p], "port %d returned twice", p)
		seen[p] = true
		require.GreaterOrEqual(t, p, lo)
		require.Less(t, p, hi)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "port %d is not free", p)
		require.NoError(t, l.Close())
	}
}

// A port once handed out is never handed out again, though it was let go at once: a caller that
// binds it later finds it still its own.
func TestFreeAddrNeverRepeatsAPort(t *testing.T) {
	seen := map[string]bool{}
	for range 300 {
		addr, err := FreeAddr()
		require.NoError(t, err)
		require.False(t, seen[addr], "%s handed out twice", addr)
		seen[addr] = true
	}
}

// A range given in KUBESCRIBE_TEST_PORT_RANGE narrows the default one; one outside it, too small
// or malformed is ignored.
func TestPortRangeEnvNarrowsTheRange(t *testing.T) {
	t.Setenv(PortRangeEnv, "")
	lo, hi := fixedPortRange()
	if hi == 0 {
		t.Skip("the ephemeral range leaves no room below it")
	}
	for v, want := range map[string][2]int{
		strconv.Itoa(lo) + "-" + strconv.Itoa(lo+4096):    {lo, lo + 4096},
		strconv.Itoa(lo+100) + "-" + strconv.Itoa(lo+200): {lo, hi},
		strconv.Itoa(lo-1) + "-" + strconv.Itoa(lo+4096):  {lo, hi},
		strconv.Itoa(lo) + "-" + strconv.Itoa(hi+1):       {lo, hi},
		"1-x": {lo, hi},
		"":    {lo, hi},
	} {
		t.Setenv(PortRangeEnv, v)
		l, h := fixedPortRange()
		require.Equal(t, want, [2]int{l, h}, "%s=%q", PortRangeEnv, v)
	}
	t.Setenv(PortRangeEnv, strconv.Itoa(lo+1024)+"-"+strconv.Itoa(lo+2048))
	ports, err := FreePorts(20)
	require.NoError(t, err)
	for _, p := range ports {
		require.GreaterOrEqual(t, p, lo+1024)
		require.Less(t, p, lo+2048)
	}
}
