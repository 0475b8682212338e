package app

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLifecycleStopsInReverseOnceAndJoinsErrors(t *testing.T) {
	var l lifecycle
	var order []string
	add := func(name string, err error) {
		l.onStop(name, func(context.Context) error { order = append(order, name); return err })
	}
	add("redis", nil)
	add("router", errors.New("2 changes not pushed"))
	add("audit server", nil)
	add("watches", errors.New("boom"))

	err := l.stop(context.Background())
	require.Equal(t, []string{"watches", "audit server", "router", "redis"}, order)
	require.ErrorContains(t, err, "watches: boom")
	require.ErrorContains(t, err, "router: 2 changes not pushed")
	require.NoError(t, l.stop(context.Background()), "a second stop does nothing")
	require.Len(t, order, 4)
}
