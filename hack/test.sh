#!/usr/bin/env bash
# hack/test.sh is make test's body (Makefile: test, after deps). It runs every test of the
# project: go test of the main module, hack/image's tests, make fuzz-endpoints and make
# cluster-test, and runs side by side what can be, so that a cold run on 2 cores stays within
# its budget
# (docs/testing.md#how-long-make-test-takes):
#
#   1. etcd and the e2e test binary are built together, then kube-apiserver;
#   2. three lanes then run at the same time:
#        e2e-main      test/e2e's tests but those of $E2E_RESTART_TESTS, on a stack of its own;
#        e2e-restarts  the tests of $E2E_RESTART_TESTS, on another stack;
#        unit          go test of every other package, then the node's binaries, hack/image's
#                      tests and make fuzz-endpoints;
#   3. make cluster-test, alone: its tear-down check compares the whole machine.
#
# The e2e tests spend most of their time waiting for the apiserver's audit retries (10 s, then
# x1.5): the restart and outage tests wait minutes with kubescribe away, so they get a stack of
# their own, and the CPU the waiting leaves builds and runs the rest. Each lane's processes pick
# their ports from a range of their own (controlplane.PortRangeEnv), so that a port one lane
# left free for a moment is never taken by another. Each lane's output is printed whole when it
# ends, with its time; the run fails when any part fails, after every part has run.
set -uo pipefail

GO=${GO:-go}
MAKE=${MAKE:-make}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
bin=$root/bin
: "${KUBE_APISERVER:=$bin/kube-apiserver}" "${ETCD:=$bin/etcd}"
export KUBE_APISERVER ETCD
# make's build flags (Makefile: CGO_ENABLED=0 and -trimpath, the image's), also when this
# script runs without make: one set of flags, one build cache for every build of the run.
export CGO_ENABLED=0
case " ${GOFLAGS-} " in
*" -trimpath "*) ;;
*) GOFLAGS=$(echo -trimpath "$("$GO" env GOFLAGS)") && export GOFLAGS ;;
esac

# The tests of test/e2e that kubescribe's restarts, kills and outages make wait for the
# apiserver's retries (their times in docs/testing.md), and those that start a stack of their
# own (Redis over TLS, Sentinel, the three-replica tests), which balance the lanes. A test
# renamed away from this list runs in e2e-main: the two lanes together always run every test.
E2E_RESTART_TESTS='^(TestOutageLongerThanTheRetryWindow|TestKilledDuringCreatesKeepsEveryAuthor|TestShutdownFinishesInFlightChanges|TestKilledMidStreamLosesNothing|TestCommitRequestSurvivesAKill|TestRestartResumesAndAttributes|TestRedisOverTLS|TestSentinelFailoverMidStream|TestReplicas.*)$'

logs=$(mktemp -d "${TMPDIR:-/tmp}/kubescribe-test.XXXXXX") || exit 1
failed=()

# portRange N prints the N-th quarter (0-3) of the ports below the ephemeral range, which
# controlplane.FreePorts picks from, or nothing when that range is too small to split.
portRange() {
	local eph hi lo q
	read -r eph _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph=32768
	hi=$eph
	lo=$((hi - 16384))
	((lo < 1024)) && lo=1024
	q=$(((hi - lo) / 4))
	((q < 256)) && return
	echo "$((lo + $1 * q))-$((lo + ($1 + 1) * q))"
}

# lane NAME PORTS CMD... runs CMD with its output in NAME's log and its ports in PORTS.
# The output goes to the log through a pipe, never straight into the file: the go command
# copies go vet's output to its stdout with copy_file_range(2) when that is a regular file, and
# a filesystem that answers EBADF fails every vet of the run ("copying vet tool stdout: ...
# copy_file_range: bad file descriptor", a CI run's build lane); into a pipe it copies plainly.
lane() {
	local name=$1 ports=$2
	shift 2
	local began=$SECONDS rc=0
	# pipefail (set above): the status is CMD's unless cat fails.
	KUBESCRIBE_TEST_PORT_RANGE=$ports "$@" 2>&1 | cat >"$logs/$name.log" || rc=$?
	echo "$rc $((SECONDS - began))" >"$logs/$name.rc"
}

# report NAME prints a finished lane's result and its log, and records a failure. The log of an
# e2e lane that passed is left out but for its summary lines, as go test leaves out a passing
# package's output; the test binary prints the stack's and the tests' logs as they come.
report() {
	local name=$1 rc secs
	read -r rc secs <"$logs/$name.rc"
	echo "=== $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)") in $((secs / 60))m$((secs % 60))s"
	if [ "$rc" = 0 ] && [[ $name == e2e-* ]]; then
		grep -E '^(e2e: |PASS$)' "$logs/$name.log"
	else
		cat "$logs/$name.log"
	fi
	[ "$rc" = 0 ] || failed+=("$name")
}

# runLanes NAME=FUNCTION... runs the functions side by side and reports each as it ends.
runLanes() {
	local -A pids=()
	local spec fn
	for spec in "$@"; do
		fn=${spec#*=}
		lane "${spec%%=*}" "$(portRange "${spec##*|}")" "${fn%%|*}" &
		pids[${spec%%=*}]=$!
	done
	# Report in the order they end, so a failure shows as soon as it can.
	while ((${#pids[@]} > 0)); do
		wait -n "${pids[@]}" 2>/dev/null
		local name
		for name in "${!pids[@]}"; do
			if [ -e "$logs/$name.rc" ]; then
				wait "${pids[$name]}" 2>/dev/null
				report "$name"
				unset "pids[$name]"
			fi
		done
	done
}

# build builds etcd beside the e2e test binary, then kube-apiserver, once the k8s.io packages
# it shares with the tests are compiled: two builds that need one package at once both compile it.
build() {
	local rc=0 pid
	"$MAKE" --no-print-directory etcd &
	pid=$!
	"$GO" test -c -o "$bin/e2e.test" ./test/e2e || rc=1
	"$MAKE" --no-print-directory kube-apiserver || rc=1
	wait "$pid" || rc=1
	return $rc
}

e2e() {
	cd "$root/test/e2e" && "$bin/e2e.test" -test.count=1 -test.timeout=30m "$@"
}
e2eMain() { e2e -test.skip "$E2E_RESTART_TESTS"; }
e2eRestarts() { e2e -test.run "$E2E_RESTART_TESTS"; }

unit() {
	local rc=0 pkgs
	pkgs=$("$GO" list ./... | grep -v '/test/e2e$') || return 1
	# shellcheck disable=SC2086 # one argument per package
	"$GO" test -count=1 -timeout 30m $pkgs || rc=1
	# What make cluster-test needs, built while the e2e lanes wait.
	"$MAKE" --no-print-directory node-binaries || rc=1
	(cd hack/image && "$GO" test -count=1 -timeout 30m ./...) || rc=1
	"$MAKE" --no-print-directory fuzz-endpoints || rc=1
	return $rc
}

clusterTest() { "$MAKE" --no-print-directory cluster-test; }

began=$SECONDS
# The spec is NAME=FUNCTION|QUARTER of the port range.
runLanes "build=build|0"
if [ ${#failed[@]} = 0 ]; then
	runLanes "e2e-main=e2eMain|0" "e2e-restarts=e2eRestarts|1" "unit=unit|2"
	runLanes "cluster=clusterTest|3"
fi
secs=$((SECONDS - began))
rm -rf "$logs"
if [ ${#failed[@]} -gt 0 ]; then
	echo "make test: FAILED (${failed[*]}) after $((secs / 60))m$((secs % 60))s"
	exit 1
fi
echo "make test: ok in $((secs / 60))m$((secs % 60))s"
