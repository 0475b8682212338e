package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a process may take to exit after SIGTERM before it gets SIGKILL.
const stopGrace = 5 * time.Second

// process is one child process: its own process group, output appended to a log file.
type process struct {
	name    string
	logPath string
	logf    func(format string, args ...any)
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has been reaped
	waitErr error         // valid after done is closed
}

// startProcess starts bin with args in a new process group, appending stdout and stderr to
// logPath. The process gets SIGKILL if the thread that started it dies (see spawn), so a
// crashed or killed test binary leaves nothing behind.
func startProcess(name, logPath, bin string, args, env []string, logf func(string, ...any)) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	// The child holds its own descriptor; ours is not needed once it started.
	defer logFile.Close()
	fmt.Fprintf(logFile, "### %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &process{name: name, logPath: logPath, logf: logf, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid returns the process id, which is also its process group id.
func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has terminated.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, SIGKILL after stopGrace, and waits until the process
// is reaped. Whatever else is left in its group is killed too. Calling it again is harmless.
func (p *process) stop() error {
	if p == nil {
		return nil
	}
	pgid := p.pid()
	if !p.exited() {
		began := time.Now()
		if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("%s: SIGTERM: %w", p.name, err)
		}
		timer := time.NewTimer(stopGrace)
		defer timer.Stop()
		select {
		case <-p.done:
			p.logf("controlplane: %s stopped after %s", p.name, time.Since(began).Round(time.Millisecond))
		case <-timer.C:
			if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("%s: SIGKILL: %w", p.name, err)
			}
			<-p.done
			p.logf("controlplane: %s ignored SIGTERM for %s and was killed", p.name, stopGrace)
		}
	}
	// Children the leader left behind in its group (none expected) go with it.
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%s: SIGKILL group: %w", p.name, err)
	}
	return nil
}

// StartChild starts cmd so that it gets SIGKILL when the test binary dies, however it dies (see
// spawn): a process a test starts by itself, such as a kubescribe replica, is not left behind
// by a test binary that was killed or crashed.
func StartChild(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	return spawn(cmd)
}

// spawner starts processes from one OS thread that never exits. Pdeathsig fires when the
// *thread* that forked the child exits, not the process, and the Go runtime may retire the
// thread that happened to run exec.Cmd.Start; a dedicated locked thread makes Pdeathsig mean
// "the test binary died".
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd: cmd, errc: errc}
	return <-errc
}

// waitReady polls check every interval until it succeeds, the process exits, ctx ends or
// timeout passes. Errors carry the tail of the process's log.
func waitReady(ctx context.Context, p *process, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	const interval = 200 * time.Millisecond
	var lastErr error
	for {
		checkCtx, checkCancel := context.WithTimeout(ctx, 5*time.Second)
		lastErr = check(checkCtx)
		checkCancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); last check: %v\n%s",
				p.name, p.waitErr, lastErr, logTail(p.logPath, 40))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v\n%s", p.name, timeout, lastErr, logTail(p.logPath, 40))
		case <-time.After(interval):
		}
	}
}

// logTail returns the last n lines of the log file at path, indented, for error messages.
func logTail(path string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- last %d lines of %s ---\n", n, path)
	writeTail(&b, path, n)
	return b.String()
}

// writeTail writes the last n lines of the file at path to w.
func writeTail(w io.Writer, path string, n int) {
	const maxRead = 1 << 20
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(w, "(%v)\n", err)
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(st.Size()-maxRead, io.SeekStart); err != nil {
			fmt.Fprintf(w, "(%v)\n", err)
			return
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		fmt.Fprintf(w, "(%v)\n", err)
		return
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for _, l := range lines {
		w.Write(l)
		io.WriteString(w, "\n")
	}
}
