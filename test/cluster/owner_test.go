package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A run directory whose owner lives is not abandoned; one whose owner let go (died) is, and so is
// one left by a version that kept no lock; a directory without a snapshot is nobody's node.
func TestAbandoned(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	mk := func(name string, snapshot bool) string {
		dir := filepath.Join(tmp, "kubescribe-node-"+name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if snapshot {
			if err := os.WriteFile(filepath.Join(dir, beforeFile), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	living, dead, old := mk("living", true), mk("dead", true), mk("old", true)
	mk("kept", false)

	owner, err := lockOwner(living)
	if err != nil || owner == nil {
		t.Fatalf("lock a new run directory: %v, %v", owner, err)
	}
	defer owner.Close()
	gone, err := lockOwner(dead)
	if err != nil || gone == nil {
		t.Fatalf("lock: %v, %v", gone, err)
	}
	gone.Close() // as the kernel does when its process dies

	if again, err := lockOwner(living); err != nil || again != nil {
		t.Fatalf("a second lock on a living node's directory: %v, %v; want none", again, err)
	}
	got, err := Abandoned()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{dead, old}; !slices.Equal(got, want) {
		t.Fatalf("Abandoned() = %v, want %v", got, want)
	}
	if err := Recover(living); err == nil {
		t.Fatal("Recover tore down a node whose owner lives")
	}
}
