package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ownerFile, in a run directory, is locked (flock, exclusive) by the process that started the
// node, for as long as it lives: the kernel releases the lock when that process dies, however it
// dies, so a run directory whose lock can be taken belongs to nobody. Go opens files
// close-on-exec, so the node's components (containerd's shims outlive it) never hold it.
const ownerFile = "owner.lock"

// lockOwner takes the run directory's owner lock without waiting. It returns (nil, nil) when a
// living process holds it.
func lockOwner(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("cluster: lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// Abandoned lists the run directories under $TMPDIR (kubescribe-node-*) that hold a snapshot
// (the node was started and never torn down) and whose owner is dead.
func Abandoned() ([]string, error) {
	befores, err := filepath.Glob(filepath.Join(os.TempDir(), "kubescribe-node-*", beforeFile))
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, b := range befores {
		dir := filepath.Dir(b)
		f, err := lockOwner(dir)
		if err != nil {
			return nil, err
		}
		if f == nil {
			continue // its owner lives
		}
		f.Close()
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// RecoverAbandoned tears down every node whose owner died before Stop (Abandoned, then Recover)
// and returns their run directories.
func RecoverAbandoned() ([]string, error) {
	dirs, err := Abandoned()
	if err != nil || len(dirs) == 0 {
		return nil, err
	}
	return dirs, Recover(dirs...)
}
