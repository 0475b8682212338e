package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

// Replicas: kubescribe as several processes of the cmd/server binary, each with listeners of its
// own, behind two controlplane.Balancers that stand in for the audit and admission Services on
// the addresses the apiserver posts to (its audit webhook kubeconfig, the CommitRequest
// webhook registration). The replicas coordinate through Leases in the namespace kubescribe
// (--coordination=leases), as the Deployment's Pods do.

// Replica is one kubescribe process of StartReplicas.
type Replica struct {
	s    *Stack
	Name string
	// OpsURL and MetricsURL are the replica's own (/readyz, /metrics).
	OpsURL, MetricsURL string
	// AuditAddr and AdmissionAddr are where it listens behind the balancers.
	AuditAddr, AdmissionAddr string
	// LogPath is its output.
	LogPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan error
	logFile *os.File
}

// StartReplicas stops the stack's kubescribe and runs one process of bin per name instead,
// behind balancers on the audit and admission addresses, and waits until each is ready.
func (s *Stack) StartReplicas(ctx context.Context, bin string, names ...string) error {
	if err := s.StopKubescribe(); err != nil {
		return err
	}
	var err error
	if s.auditLB, err = controlplane.StartBalancer(s.ControlPlane.Audit.ListenAddr, nil); err != nil {
		return fmt.Errorf("audit balancer: %w", err)
	}
	if s.admissionLB, err = controlplane.StartBalancer(s.admissionAddr, nil); err != nil {
		return fmt.Errorf("admission balancer: %w", err)
	}
	s.serverBin = bin
	for _, name := range names {
		if _, err := s.StartReplica(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// StartReplica starts (again) the replica name and waits until it is ready and the balancers
// send it connections.
func (s *Stack) StartReplica(ctx context.Context, name string) (*Replica, error) {
	if s.auditLB == nil {
		return nil, errors.New("stack: StartReplicas first")
	}
	ports, err := controlplane.FreePorts(4)
	if err != nil {
		return nil, err
	}
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	r := &Replica{s: s, Name: name, AuditAddr: addr(0), AdmissionAddr: addr(1),
		OpsURL: "http://" + addr(2), MetricsURL: "https://" + addr(3) + "/metrics",
		LogPath: filepath.Join(s.ControlPlane.Dir, "kubescribe-"+name+".log")}
	if r.logFile, err = os.OpenFile(r.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
		return nil, err
	}
	args := append(s.processArgs(r.AuditAddr, r.AdmissionAddr, addr(2), addr(3)),
		"--replica-name="+name, "--coordination-namespace=kubescribe")
	args = append(args, s.replicaArgs...)
	r.cmd = exec.Command(s.serverBin, args...)
	r.cmd.Stdout, r.cmd.Stderr = r.logFile, r.logFile
	if err := controlplane.StartChild(r.cmd); err != nil {
		_ = r.logFile.Close()
		return nil, fmt.Errorf("starting replica %s: %w", name, err)
	}
	r.done = make(chan error, 1)
	go func() { r.done <- r.cmd.Wait() }()
	s.replicasMu.Lock()
	s.replicas[name] = r
	s.replicasMu.Unlock()
	s.updateBackends()
	if err := r.waitReady(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// Replica returns the replica name, nil when none was started.
func (s *Stack) Replica(name string) *Replica {
	s.replicasMu.Lock()
	defer s.replicasMu.Unlock()
	return s.replicas[name]
}

// updateBackends points the balancers at the replicas started.
func (s *Stack) updateBackends() {
	s.replicasMu.Lock()
	var audit, adm []controlplane.Backend
	for _, r := range s.replicas {
		audit = append(audit, controlplane.Backend{Addr: r.AuditAddr, ReadyURL: r.OpsURL + "/readyz"})
		adm = append(adm, controlplane.Backend{Addr: r.AdmissionAddr, ReadyURL: r.OpsURL + "/readyz"})
	}
	s.replicasMu.Unlock()
	s.auditLB.SetBackends(audit...)
	s.admissionLB.SetBackends(adm...)
}

// waitReady waits until the replica answers /readyz and the audit balancer counts it ready.
func (r *Replica) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(r.OpsURL + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && r.s.auditLB.IsReady(r.AuditAddr) {
				return nil
			}
		}
		select {
		case err := <-r.done:
			r.done <- err
			return fmt.Errorf("replica %s stopped while starting: %v", r.Name, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("replica %s not ready after a minute", r.Name)
}

// Kill ends the replica as SIGKILL does: nothing of its shutdown runs.
func (r *Replica) Kill() error { return r.end(syscall.SIGKILL) }

// Stop ends the replica gracefully, as SIGTERM does (a rolling update), and returns once it
// exited.
func (r *Replica) Stop() error { return r.end(syscall.SIGTERM) }

func (r *Replica) end(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return nil
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a paused one must run to end
	_ = r.cmd.Process.Signal(sig)
	err := <-r.done
	r.cmd = nil
	_ = r.logFile.Close()
	if sig == syscall.SIGKILL {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replica %s: %w", r.Name, err)
	}
	return nil
}

// Pause stops the replica's process (SIGSTOP): it does nothing, renews nothing, answers
// nothing, as a process the kernel or a debugger holds. Resume lets it go on.
func (r *Replica) Pause() error { return r.signal(syscall.SIGSTOP) }

// Resume lets a paused replica go on (SIGCONT).
func (r *Replica) Resume() error { return r.signal(syscall.SIGCONT) }

func (r *Replica) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return fmt.Errorf("replica %s does not run", r.Name)
	}
	return r.cmd.Process.Signal(sig)
}

// PID is the replica's process id, 0 when it does not run.
func (r *Replica) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// Replicas returns the replicas started, in no order.
func (s *Stack) Replicas() []*Replica {
	s.replicasMu.Lock()
	defer s.replicasMu.Unlock()
	out := make([]*Replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		out = append(out, r)
	}
	return out
}

// Running reports whether the replica's process runs.
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil
}

// ScrapeMetrics reads the replica's /metrics as Stack.ScrapeMetrics reads kubescribe's.
func (r *Replica) ScrapeMetrics() (map[string]float64, error) { return r.s.scrapeMetrics(r.MetricsURL) }

// stopReplicas stops every replica gracefully and the balancers.
func (s *Stack) stopReplicas() error {
	s.replicasMu.Lock()
	rs := make([]*Replica, 0, len(s.replicas))
	for _, r := range s.replicas {
		rs = append(rs, r)
	}
	s.replicasMu.Unlock()
	var errs []error
	for _, r := range rs {
		errs = append(errs, r.Stop())
	}
	for _, lb := range []*controlplane.Balancer{s.auditLB, s.admissionLB} {
		if lb != nil {
			errs = append(errs, lb.Close())
		}
	}
	return errors.Join(errs...)
}
