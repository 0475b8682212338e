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
