package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one component of the node: its own process group, output appended to <name>.log.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // after done
}

// launcher starts every child from one locked OS thread, so that Pdeathsig (which fires when the
// *thread* that forked a child exits) means "the test binary died": a killed test leaves no
// kubelet or apiserver running. The Go runtime would otherwise retire threads at will.
var launcher struct {
	once sync.Once
	reqs chan launchReq
}

type launchReq struct {
	cmd  *exec.Cmd
	errc chan error
}

func launch(cmd *exec.Cmd) error {
	launcher.once.Do(func() {
		launcher.reqs = make(chan launchReq)
		go func() {
			runtime.LockOSThread() // never unlocked
			for r := range launcher.reqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	launcher.reqs <- launchReq{cmd, errc}
	return <-errc
}

// startProc starts bin with args, its output appended to dir/<name>.log.
func startProc(dir, name, bin string, args []string, env []string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "### %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := launch(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the process group and SIGKILL after grace, then kills whatever is left
// in the group. It returns once the process is reaped. A nil proc is a no-op.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	pgid := p.cmd.Process.Pid
	if p.running() {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// wait polls check until it succeeds, the process exits, ctx ends or timeout passes.
func (p *proc) wait(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready: %v\n%s", p.name, p.err, last, tail(p.logPath, 30))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v\n%s", p.name, timeout, last, tail(p.logPath, 30))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "--- " + path + " ---\n" + strings.Join(lines, "\n")
}

// run runs a short command and returns its combined output; the error carries the output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// errs collects the errors of a tear-down that goes on after each failure.
type errs []error

func (e *errs) add(err error) {
	if err != nil {
		*e = append(*e, err)
	}
}

func (e errs) join() error { return errors.Join(e...) }
