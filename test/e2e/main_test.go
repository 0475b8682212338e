// Package e2e proves kubescribe's features the way a user meets them: changes made through a
// real kube-apiserver by real users, audit events over real TLS, facts in a real Redis, commits
// pushed to a real Git server. One stack is started for the whole package run.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kubescribe/kubescribe/test/stack"
)

// env is the stack every test shares.
var env *stack.Stack

// testGrace is the attribution grace window of the kubescribe under test. It is longer than the
// default so that a test stopping Redis for a moment stays inside it.
const testGrace = 8 * time.Second

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kubescribe-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	env, err = stack.Start(ctx, stack.Options{Dir: dir, Grace: testGrace, RemoteRoutes: []string{remoteRoute}, AuditRouteNamespaces: remoteRouteNamespaces, Logf: func(f string, a ...any) {
		fmt.Printf(f+"\n", a...)
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the stack:", err)
		fmt.Fprintln(os.Stderr, "e2e: logs kept in", dir)
		return 1
	}
	fmt.Printf("e2e: stack started in %s\n", time.Since(began).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		env.DumpLogs(os.Stderr, 60)
		fmt.Fprintln(os.Stderr, "e2e: logs kept in", dir)
	}
	if err := stopRemote(code != 0); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stopping the remote cluster:", err)
	}
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stopping the stack:", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		_ = os.RemoveAll(dir)
	}
	return code
}
