package git

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/gittest"
)

// The benchmarks compare sub-benchmarks side by side (make bench prints each as a ratio to its
// sibling named baseline*); none asserts a time. Fixtures: benchfixture_test.go.

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// seededBuilder returns a tree builder over a store holding one commit of files objects, 100
// per namespace, and that commit.
func seededBuilder(tb testing.TB, files int) (treeBuilder, plumbing.Hash, map[plumbing.Hash]int32) {
	tb.Helper()
	seed := make([]attribution.AttributedChange, 0, files)
	for i := range files {
		seed = append(seed, benchChange(i, "seed"))
	}
	return seededStore(tb, seed)
}

// seededStore returns a tree builder over a store holding one commit of the changes seed, that
// commit, and its trees' path counts: what a worker holds after its start (trees, no blobs).
func seededStore(tb testing.TB, seed []attribution.AttributedChange) (treeBuilder, plumbing.Hash, map[plumbing.Hash]int32) {
	tb.Helper()
	b := treeBuilder{s: memory.NewStorage(), trees: newTreeCache()}
	committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
	self := Signature{Name: "kubescribe", Email: "k@example.com"}
	tip, ok, err := b.materialize(newPlan("", seed, self, "users.example.com", fixedNow), plumbing.ZeroHash, committer)
	require.NoError(tb, err)
	require.True(tb, ok)
	store, refs, _, err := compactStore(b.s.(*memory.Storage), tip, plumbing.ZeroHash)
	require.NoError(tb, err)
	b.s = store
	return b, tip, refs
}

// benchCommitLoop builds one commit of one changed object per iteration, on the previous one:
// the object change(i) returns. The store is pruned or compacted as a worker's is after a push
// (each time it gained compactSlack objects or compactBytes bytes), inside the timer.
func benchCommitLoop(b *testing.B, tb treeBuilder, tip plumbing.Hash, refs map[plumbing.Hash]int32, change func(i int) attribution.AttributedChange) {
	gc := newStoreGC()
	gc.reset(refs, nil)
	store := tb.s.(*memory.Storage)
	compactAt, growth := len(store.Objects)+compactSlack, int64(0)
	committer := object.Signature{Name: "kubescribe", Email: "k@example.com", When: fixedNow}
	self := Signature{Name: "kubescribe", Email: "k@example.com"}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		p := newPlan("", []attribution.AttributedChange{change(i)}, self, "users.example.com", fixedNow)
		var ok bool
		var err error
		tip, ok, err = tb.materialize(p, tip, committer)
		if err != nil || !ok {
			b.Fatalf("commit %d: ok=%v err=%v", i, ok, err)
		}
		for _, o := range p.objects {
			growth += store.Objects[o.hash].Size()
		}
		gc.committed(store, tip, p.objects)
		if len(store.Objects) < compactAt && growth < compactBytes {
			continue
		}
		if !gc.prune(store, map[plumbing.Hash]bool{tip: true}) {
			if store, refs, _, err = compactStore(store, tip, plumbing.ZeroHash); err != nil {
				b.Fatal(err)
			}
			gc.reset(refs, nil)
			tb.s = store
		}
		compactAt, growth = len(store.Objects)+compactSlack, 0
	}
}

// sameObject changes the fixtures' object in the first namespace (benchNamespace) in every
// commit: the worst case for the root tree, whose hashing starts again at its first entry.
func sameObject(i int) attribution.AttributedChange {
	return cmChangeAttributed(fmt.Sprintf("v%d", i))
}

// spreadObjects changes a different object in every commit, spread over all the namespaces
// of a repository of files files, as a cluster's changes are.
func spreadObjects(files int) func(i int) attribution.AttributedChange {
	return func(i int) attribution.AttributedChange {
		return benchChange((i*7919)%files, fmt.Sprintf("v%d", i))
	}
}

// BenchmarkCommit (a): one commit of one changed object in a repository of 1,000 files and in
// one of 100,000 (target ratio <= 1.5). Only the trees on the changed path are rewritten, so
// what grows with the repository is the root: 1,000 namespaces make it 34 KB, to be hashed
// from the first entry the commit changed. Each commit changes the same object of the first
// namespace (the worst case); BenchmarkCommitSpread spreads them.
func BenchmarkCommit(b *testing.B) {
	benchCommitSizes(b, func(int) func(int) attribution.AttributedChange { return sameObject })
}

// BenchmarkCommitSpread (a): as BenchmarkCommit, each commit changing another object, spread
// over every namespace.
func BenchmarkCommitSpread(b *testing.B) {
	benchCommitSizes(b, spreadObjects)
}

func benchCommitSizes(b *testing.B, changes func(files int) func(int) attribution.AttributedChange) {
	for _, files := range []int{1_000, 100_000} {
		name := fmt.Sprintf("files=%d", files)
		if files == 1_000 {
			name = "baseline-" + name
		}
		b.Run(name, func(b *testing.B) {
			tb, tip, refs := seededBuilder(b, files)
			benchCommitLoop(b, tb, tip, refs, changes(files))
		})
	}
}

// BenchmarkCommitVsCLI (b): the same commit in the 100,000-file repository against
// `git add <file> && git commit` of the git CLI in a checkout of it (target: the CLI >= 100x).
func BenchmarkCommitVsCLI(b *testing.B) {
	const files = 100_000
	b.Run("baseline-kubescribe", func(b *testing.B) {
		tb, tip, refs := seededBuilder(b, files)
		benchCommitLoop(b, tb, tip, refs, sameObject)
	})
	b.Run("git-cli-add-commit", func(b *testing.B) {
		work := benchWorktree(b, files)
		path := ObjectPath("", cmChangeAttributed("x").Change)
		i := 0
		for b.Loop() {
			i++
			require.NoError(b, os.WriteFile(filepath.Join(work, path), cmChangeAttributed(fmt.Sprintf("cli-%d", i)).Manifest, 0o644))
			runGit(b, work, "add", path)
			runGit(b, work, "-c", "user.name=alice", "-c", "user.email=alice@example.com", "commit", "-q", "-m", "update")
		}
	})
}

// benchWorktree returns a cached checkout of the fixture of files files. Benchmarks add commits
// to it; they never push them.
func benchWorktree(b *testing.B, files int) string {
	b.Helper()
	fixture := benchFixture(b, files)
	benchFixtureMu.Lock()
	defer benchFixtureMu.Unlock()
	dir := filepath.Join(benchCacheDir(b), fmt.Sprintf("files-%d-worktree", files))
	if _, err := os.Stat(filepath.Join(dir, ".git", "kubescribe-fixture-complete")); err == nil {
		return dir
	}
	require.NoError(b, os.RemoveAll(dir))
	runGit(b, "", "clone", "-q", fixture, dir)
	require.NoError(b, os.WriteFile(filepath.Join(dir, ".git", "kubescribe-fixture-complete"), nil, 0o644))
	return dir
}

// pushSetup copies the fixture of files files as the remote repo.git, serves it over HTTPS
// and returns the server and the repository URL.
func pushSetup(b *testing.B, files int) (*benchServer, string, string) {
	b.Helper()
	fixture := benchFixture(b, files)
	root := b.TempDir()
	gitDir := copyBare(b, fixture, root, "repo.git")
	srv := newBenchServer(b, root)
	return srv, srv.url + "/repo.git", gitDir
}

// benchKubescribePush measures the worker's push of one new commit per iteration (the commit
// itself is built outside the timer) and reports the request bytes the server received.
func benchKubescribePush(b *testing.B, files int) {
	srv, url, _ := pushSetup(b, files)
	w := benchWorker(b, url, srv.ca)
	ctx := context.Background()
	require.NoError(b, w.open(ctx))
	require.NoError(b, w.rebuild())
	sent, receiving := srv.sent.Load(), srv.receiving.Load()
	i := 0
	for b.Loop() {
		i++
		b.StopTimer()
		require.NoError(b, w.benchCommit(i))
		b.StartTimer()
		if err := w.benchPush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	reportPush(b, srv, i, sent, receiving)
}

// reportPush reports, per push, the bytes sent and the time the server spent in receive-pack
// (receive-ms/op; the rest of the time is the client's and the transport's: client-ms/op).
func reportPush(b *testing.B, srv *benchServer, pushes int, sent, receiving int64) {
	b.ReportMetric(float64(srv.sent.Load()-sent)/float64(pushes), "sent-B/op")
	recv := float64(srv.receiving.Load()-receiving) / float64(pushes)
	b.ReportMetric(recv/1e6, "receive-ms/op")
	b.ReportMetric((float64(b.Elapsed().Nanoseconds())/float64(pushes)-recv)/1e6, "client-ms/op")
}

// benchCLIPush measures `git push` of one new commit per iteration from a clone of the fixture
// (the commit is made outside the timer) and reports the request bytes the server received.
func benchCLIPush(b *testing.B, files int) {
	srv, url, _ := pushSetup(b, files)
	client := filepath.Join(b.TempDir(), "client")
	runGit(b, "", "clone", "-q", "--no-checkout", benchFixture(b, files), client)
	runGit(b, client, "reset", "-q") // index of the tip, without writing every file
	path := ObjectPath("", cmChangeAttributed("x").Change)
	require.NoError(b, os.MkdirAll(filepath.Dir(filepath.Join(client, path)), 0o755))
	sent, receiving := srv.sent.Load(), srv.receiving.Load()
	i := 0
	for b.Loop() {
		i++
		b.StopTimer()
		require.NoError(b, os.WriteFile(filepath.Join(client, path), cmChangeAttributed(fmt.Sprintf("cli-%d", i)).Manifest, 0o644))
		runGit(b, client, "add", path)
		runGit(b, client, "-c", "user.name=alice", "-c", "user.email=alice@example.com", "commit", "-q", "-m", "update")
		b.StartTimer()
		srv.git(b, client, "push", "-q", url, "HEAD:refs/heads/main")
	}
	reportPush(b, srv, i, sent, receiving)
}

// BenchmarkPush (c): the worker's push of one commit to a remote holding 1,000 files and to one
// holding 100,000 files, each with history (target ratio <= 1.5); the git CLI's pushes to the
// same remotes show how much of the growth is the server's.
func BenchmarkPush(b *testing.B) {
	b.Run("baseline-files=1000", func(b *testing.B) { benchKubescribePush(b, 1_000) })
	b.Run("files=100000", func(b *testing.B) { benchKubescribePush(b, 100_000) })
	b.Run("git-cli-files=1000", func(b *testing.B) { benchCLIPush(b, 1_000) })
	b.Run("git-cli-files=100000", func(b *testing.B) { benchCLIPush(b, 100_000) })
}

// BenchmarkPushVsCLI (c): the worker's push of one commit to the 100,000-file remote against
// `git push` of the CLI from a clone (target: <= 1x the CLI's time, <= 1.5x its bytes).
func BenchmarkPushVsCLI(b *testing.B) {
	b.Run("baseline-git-cli-push", func(b *testing.B) { benchCLIPush(b, 100_000) })
	b.Run("kubescribe", func(b *testing.B) { benchKubescribePush(b, 100_000) })
}

// BenchmarkStart (d): a worker's start (its first fetch) on the 100,000-file remote against
// `git clone --bare --depth 1` of the branch (target: <= 1x its time; heap in use after the
// start < 100 MiB). kubescribe-nofilter is a server that refuses partial clone filters.
func BenchmarkStart(b *testing.B) {
	const files = 100_000
	b.Run("baseline-git-clone-bare-depth1", func(b *testing.B) {
		srv, url, _ := pushSetup(b, files)
		dir := b.TempDir()
		i := 0
		for b.Loop() {
			i++
			dst := filepath.Join(dir, fmt.Sprint(i))
			srv.git(b, "", "clone", "-q", "--bare", "--depth", "1", "--single-branch", "--branch", "main", url, dst)
			b.StopTimer()
			require.NoError(b, os.RemoveAll(dst))
			b.StartTimer()
		}
	})
	for _, filter := range []bool{true, false} {
		name := "kubescribe"
		if !filter {
			name = "kubescribe-nofilter"
		}
		b.Run(name, func(b *testing.B) {
			srv, url, gitDir := pushSetup(b, files)
			if !filter {
				runGit(b, "", "--git-dir="+gitDir, "config", "uploadpack.allowFilter", "false")
			}
			ctx := context.Background()
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			before := ms.HeapInuse
			var last *Worker
			for b.Loop() {
				last = nil
				w := benchWorker(b, url, srv.ca)
				if err := w.open(ctx); err != nil {
					b.Fatal(err)
				}
				last = w
			}
			runtime.GC()
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
			b.ReportMetric((float64(ms.HeapInuse)-float64(before))/(1<<20), "heap-delta-MiB")
			b.ReportMetric(float64(len(last.store.Objects)), "store-objects")
			runtime.KeepAlive(last)
		})
	}
}

// BenchmarkCommitSigned: BenchmarkCommitSpread's commit in the 1,000-file repository, unsigned
// (the baseline) and signed in-process with each kind of key (no process is spawned): ed25519
// and RSA 3072 SSH keys (sshsig), and an EdDSA OpenPGP key.
func BenchmarkCommitSigned(b *testing.B) {
	const files = 1_000
	ed := benchSigningKey(b, func() (any, error) { _, k, err := ed25519.GenerateKey(rand.Reader); return k, err })
	rsaKey := benchSigningKey(b, func() (any, error) { return rsa.GenerateKey(rand.Reader, 3072) })
	pgp, _ := gittest.NewOpenPGPKey(b, "kubescribe", "k@example.com", "")
	for _, c := range []struct {
		name string
		key  []byte
	}{{"baseline-unsigned", nil}, {"ssh-ed25519", ed}, {"ssh-rsa3072", rsaKey}, {"openpgp-eddsa", pgp}} {
		b.Run(c.name, func(b *testing.B) {
			tb, tip, refs := seededBuilder(b, files)
			if c.key != nil {
				s, err := ParseSigningKey(c.key, nil)
				require.NoError(b, err)
				tb.sign = s
			}
			benchCommitLoop(b, tb, tip, refs, spreadObjects(files))
		})
	}
}

// BenchmarkCommitPushSigned: what the worker does for each change, one commit and its push to
// the 1,000-file remote over HTTPS, unsigned (the baseline) and signed with an ed25519 SSH key
// and an EdDSA OpenPGP key.
func BenchmarkCommitPushSigned(b *testing.B) {
	ed := benchSigningKey(b, func() (any, error) { _, k, err := ed25519.GenerateKey(rand.Reader); return k, err })
	pgp, _ := gittest.NewOpenPGPKey(b, "kubescribe", "k@example.com", "")
	for _, c := range []struct {
		name string
		key  []byte
	}{{"baseline-unsigned", nil}, {"ssh-ed25519", ed}, {"openpgp-eddsa", pgp}} {
		b.Run(c.name, func(b *testing.B) {
			srv, url, _ := pushSetup(b, 1_000)
			w := benchWorker(b, url, srv.ca)
			if c.key != nil {
				s, err := ParseSigningKey(c.key, nil)
				require.NoError(b, err)
				w.signer = s
			}
			ctx := context.Background()
			require.NoError(b, w.open(ctx))
			require.NoError(b, w.rebuild())
			i := 0
			for b.Loop() {
				i++
				if err := w.benchCommit(i); err != nil {
					b.Fatal(err)
				}
				if err := w.benchPush(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchSigningKey returns the OpenSSH private key gen makes.
func benchSigningKey(b *testing.B, gen func() (any, error)) []byte {
	b.Helper()
	k, err := gen()
	require.NoError(b, err)
	block, err := ssh.MarshalPrivateKey(k, "")
	require.NoError(b, err)
	return pem.EncodeToMemory(block)
}

// BenchmarkTakeIn: what a worker pays, per commit another writer of its slot made, to read what
// the commit carries (carried.go) when it rebuilds on a moved tip or opens the branch, beside
// what building one commit costs (baseline: BenchmarkCommit's 1,000-file case). Each commit
// carries 10 changes. make bench prints the ratio; one op is one commit.
func BenchmarkTakeIn(b *testing.B) {
	b.Run("baseline-commit", func(b *testing.B) {
		tb, tip, refs := seededBuilder(b, 1_000)
		benchCommitLoop(b, tb, tip, refs, sameObject)
	})
	b.Run("takein", func(b *testing.B) {
		var changes []attribution.AttributedChange
		for i := range 10 {
			changes = append(changes, benchChange(i, "v"))
		}
		msg := commitMessage(changes, false) + folderTrailer("team") + writerTrailer("team-a/git", 3)
		s := memory.NewStorage()
		var tip plumbing.Hash
		for range b.N {
			c := &object.Commit{Message: msg, TreeHash: plumbing.ZeroHash}
			if !tip.IsZero() {
				c.ParentHashes = []plumbing.Hash{tip}
			}
			obj := s.NewEncodedObject()
			require.NoError(b, c.Encode(obj))
			h, err := s.SetEncodedObject(obj)
			require.NoError(b, err)
			tip = h
		}
		w := &Worker{opts: Options{WriterSlot: "team-a/git"}}
		b.ResetTimer()
		_, complete := w.takeIn(s, tip, plumbing.ZeroHash, b.N+1)
		b.StopTimer()
		require.True(b, complete)
		require.Len(b, w.held, 10)
	})
}
