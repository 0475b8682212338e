package git

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/hiddeco/sshsig"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/gittest"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// sshKeyPEM returns an OpenSSH private key of key (encrypted with passphrase unless empty).
func sshKeyPEM(t *testing.T, key any, passphrase string) []byte {
	t.Helper()
	var block *pem.Block
	var err error
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(key, "")
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(key, "", []byte(passphrase))
	}
	require.NoError(t, err)
	return pem.EncodeToMemory(block)
}

func TestParseSigningKeySignsWithEachKind(t *testing.T) {
	ed, edSigner := gittest.NewSSHKey(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pgpSecret, pgpPublic := gittest.NewOpenPGPKey(t, "kubescribe", "kubescribe@example.com", "")
	pgpLocked, lockedPublic := gittest.NewOpenPGPKey(t, "kubescribe", "kubescribe@example.com", "s3cret")
	payload := []byte("tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nmessage\n")

	for _, tc := range []struct {
		name       string
		key        []byte
		passphrase string
		pub        ssh.PublicKey // SSH keys: the signature verifies against it
		pgp        []byte        // OpenPGP keys: the armored public key
		describe   string
	}{
		{name: "ssh ed25519", key: ed, pub: edSigner.PublicKey(), describe: "SSH ssh-ed25519 key SHA256:"},
		{name: "ssh rsa, protected", key: sshKeyPEM(t, rsaKey, "pw"), passphrase: "pw", pub: mustSSHPublic(t, &rsaKey.PublicKey), describe: "SSH ssh-rsa key SHA256:"},
		{name: "ssh ecdsa", key: sshKeyPEM(t, ecKey, ""), pub: mustSSHPublic(t, &ecKey.PublicKey), describe: "SSH ecdsa-sha2-nistp256 key SHA256:"},
		{name: "openpgp", key: pgpSecret, pgp: pgpPublic, describe: "OpenPGP key "},
		{name: "openpgp, protected", key: pgpLocked, passphrase: "s3cret", pgp: lockedPublic, describe: "OpenPGP key "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSigningKey(tc.key, []byte(tc.passphrase))
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(s.Key(), tc.describe), s.Key())
			sig, err := s.Sign(payload)
			require.NoError(t, err)
			if tc.pub != nil {
				require.True(t, strings.HasPrefix(sig, "-----BEGIN SSH SIGNATURE-----"), sig)
				parsed, err := sshsig.Unarmor([]byte(sig))
				require.NoError(t, err)
				require.NoError(t, sshsig.Verify(bytes.NewReader(payload), parsed, tc.pub, sshsig.HashSHA512, "git"))
				require.Error(t, sshsig.Verify(bytes.NewReader(append(payload, 'x')), parsed, tc.pub, sshsig.HashSHA512, "git"))
				return
			}
			require.True(t, strings.HasPrefix(sig, "-----BEGIN PGP SIGNATURE-----"), sig)
			ring, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(tc.pgp))
			require.NoError(t, err)
			_, err = openpgp.CheckArmoredDetachedSignature(ring, bytes.NewReader(payload), strings.NewReader(sig), nil)
			require.NoError(t, err)
		})
	}
}

func mustSSHPublic(t *testing.T, key any) ssh.PublicKey {
	t.Helper()
	pub, err := ssh.NewPublicKey(key)
	require.NoError(t, err)
	return pub
}

// A key that cannot sign is refused with the reason, and the error quotes no key material.
func TestParseSigningKeyRefusals(t *testing.T) {
	ed, edSigner := gittest.NewSSHKey(t)
	_, edPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	locked := sshKeyPEM(t, edPriv, "pw")
	_, pgpPublic := gittest.NewOpenPGPKey(t, "kubescribe", "kubescribe@example.com", "")
	pgpLocked, _ := gittest.NewOpenPGPKey(t, "kubescribe", "kubescribe@example.com", "s3cret")

	for _, tc := range []struct {
		name, passphrase, want string
		key                    []byte
	}{
		{name: "empty", key: []byte("  \n"), want: "the signing key is empty"},
		{name: "garbage", key: []byte("not a key"), want: "neither an OpenSSH or PEM private key nor an armored OpenPGP private key"},
		{name: "ssh public key", key: ssh.MarshalAuthorizedKey(edSigner.PublicKey()), want: "is a public key"},
		{name: "openpgp public key", key: pgpPublic, want: "is a public key"},
		{name: "ssh key without its passphrase", key: locked, want: "protected by a passphrase, and the Secret holds none"},
		{name: "ssh key with a wrong passphrase", key: locked, passphrase: "nope", want: "passphrase is wrong"},
		{name: "openpgp key without its passphrase", key: pgpLocked, want: "protected by a passphrase, and the Secret holds none"},
		{name: "openpgp key with a wrong passphrase", key: pgpLocked, passphrase: "nope", want: "passphrase is wrong"},
		{name: "truncated ssh key", key: ed[:len(ed)/2], want: "cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSigningKey(tc.key, []byte(tc.passphrase))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			for _, line := range strings.Split(string(tc.key), "\n") {
				if len(line) >= 16 && !strings.HasPrefix(line, "-----") {
					require.NotContains(t, err.Error(), line, "the error quotes the key")
				}
			}
		})
	}
}

// The committer's commits are signed, every one: the first push, the commits after it, and
// those built again on top of someone else's push. The real git verifies each with the trusted
// key, for an SSH and for an OpenPGP key; a commit made by someone else is not kubescribe's.
func TestWorkerSignsEveryCommitGitVerifies(t *testing.T) {
	for _, kind := range []string{SigningFormatSSH, SigningFormatOpenPGP} {
		t.Run(kind, func(t *testing.T) {
			var key []byte
			var verifier gittest.Verifier
			if kind == SigningFormatSSH {
				var signer ssh.Signer
				key, signer = gittest.NewSSHKey(t)
				verifier = gittest.SSHVerifier(t, "kubescribe@example.com", signer.PublicKey())
			} else {
				var pub []byte
				key, pub = gittest.NewOpenPGPKey(t, "kubescribe", "kubescribe@example.com", "")
				verifier = gittest.OpenPGPVerifier(t, pub)
			}
			s, err := ParseSigningKey(key, nil)
			require.NoError(t, err)
			gitDir, url, tw := startPushed(t, "apps", func(o *Options) { o.Signer = s }, "one", "two")
			require.NoError(t, tw.stop(t))

			// Bob pushes; the worker's next commits are built on his.
			pushCommitFromClone(t, url, "main", "README.md", "bob's\n")
			opts := testOptions(url)
			opts.CommitWindow = 10 * time.Millisecond
			opts.Signer = s
			tw = startWorker(t, opts)
			tw.Submit("apps", by("alice", "a3", cmChange(watch.OpUpdate, "demo", "one", "2")))
			tw.waitPushed(t)
			// A foreign push while a commit is unpushed: the push is refused, the commit built
			// again on top and signed again.
			hold, release := holdPushes(t, tw)
			tw.Submit("apps", by("alice", "a4", cmChange(watch.OpUpdate, "demo", "two", "2")))
			hold(2)
			pushCommitFromClone(t, url, "main", "NOTES.md", "bob again\n")
			release()
			require.Eventually(t, func() bool { return tw.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond)
			log := gitLog(t, gitDir, "main", "%ce %s")
			require.True(t, strings.HasPrefix(log[0], "kubescribe@example.com "), "the held commit was built again on bob's: %q", log)
			require.Equal(t, "bob@example.com manual edit", log[1])

			ours := 0
			for _, line := range gitLog(t, gitDir, "main", "%H %ce") {
				sha, email, _ := strings.Cut(line, " ")
				out, err := verifier.Verify(gitDir, sha)
				if email != "kubescribe@example.com" {
					require.Error(t, err, "bob's commit %s is unsigned", sha)
					continue
				}
				ours++
				require.NoError(t, err, "git verify-commit %s: %s", sha, out)
			}
			require.GreaterOrEqual(t, ours, 3)
		})
	}
}

// A key that cannot sign holds the commits: nothing is pushed, the failure says why, and once a
// key that signs is set, the held changes are pushed signed.
func TestARefusingSignerHoldsCommitsUntilAKeySigns(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Signer = RefusingSigner(`signing Secret "sign" has no "signing.key" key`)
	tw := startWorker(t, opts)
	tw.Submit("apps", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	require.Eventually(t, func() bool {
		for _, err := range tw.failures() {
			if strings.Contains(err.Error(), `the signing key cannot sign: signing Secret "sign" has no "signing.key" key`) {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond)
	_, err := gittest.Output("", "--git-dir="+gitDir, "rev-parse", "--verify", "-q", "refs/heads/main")
	require.Error(t, err, "nothing was pushed unsigned")
	require.Equal(t, 1, tw.Status().Pending)

	key, signer := gittest.NewSSHKey(t)
	s, err := ParseSigningKey(key, nil)
	require.NoError(t, err)
	tw.SetSigner(s)
	tw.waitPushed(t)
	require.Len(t, gitLog(t, gitDir, "main", "%H"), 1)
	tip := gitLog(t, gitDir, "main", "%H")[0]
	out, err := gittest.SSHVerifier(t, "kubescribe@example.com", signer.PublicKey()).Verify(gitDir, tip)
	require.NoError(t, err, out)
}

// A key replaced while commits wait unpushed: they are built again and pushed with the new
// key, none with the old one; a worker that signed nothing before signs them once a key is set.
func TestSetSignerSignsTheUnpushedCommitsAgain(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := newTestWorker(t, opts) // unsigned
	hold, release := holdPushes(t, tw)
	tw.start(t)
	tw.Submit("apps", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	hold(1)

	key, signer := gittest.NewSSHKey(t)
	s, err := ParseSigningKey(key, nil)
	require.NoError(t, err)
	tw.SetSigner(s)
	require.Eventually(t, func() bool { return strings.Count(tw.logs.String(), "msg=committed") >= 2 }, 20*time.Second, 10*time.Millisecond,
		"the unpushed commit is built again")
	release()
	tw.waitPushed(t)
	tip := gitLog(t, gitDir, "main", "%H")[0]
	out, err := gittest.SSHVerifier(t, "kubescribe@example.com", signer.PublicKey()).Verify(gitDir, tip)
	require.NoError(t, err, out)
}

// With signing, a commit's trailers count only when the slot's key signed it. Someone with push
// access pushes an unsigned commit claiming the slot's next epoch (one the counter handed out)
// and a newer version of an object: the worker is not superseded, holds nothing of it, and
// commits the object's real version.
func TestWithSigningOnlySignedTrailersCount(t *testing.T) {
	ctx := context.Background()
	key, _ := gittest.NewSSHKey(t)
	s, err := ParseSigningKey(key, nil)
	require.NoError(t, err)
	gitDir, url := newBareRemote(t)
	epochs := NewWriterEpochs(redistest.Start(t), keyspace.MustParse("test:"))
	provider := types.NamespacedName{Namespace: "team-a", Name: "git"}
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Signer = s
	opts.WriterSlot = "team-a/git"
	opts.WriterEpoch = func(ctx context.Context) (int64, error) { return epochs.Next(ctx, provider, "main") }
	opts.EpochIssued = func(ctx context.Context, e int64) (bool, error) { return epochs.Issued(ctx, provider, "main", e) }
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("team", by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)))
	tw.waitPushed(t)
	_, err = epochs.Next(ctx, provider, "main") // epoch 2 was handed out (to nobody who wrote)
	require.NoError(t, err)

	forged := "update configmaps demo/app\n\nupdate core/configmaps demo/app resourceVersion=999 uid=uid-app\n\n" +
		"Kubescribe-User: mallory\nKubescribe-Cluster: prod\nKubescribe-Folder: /team\nKubescribe-Writer: team-a/git 2"
	bobCommits(t, url, "main", forged, func(dir string) {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "elsewhere"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "elsewhere", "x"), []byte("x"), 0o644))
		runGit(t, dir, "add", "elsewhere")
	})
	tw.Submit("team", by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102)))
	require.Eventually(t, func() bool { return len(tw.pushes.commits()) == 2 }, 20*time.Second, 10*time.Millisecond, "%s", tw.logs.String())
	require.False(t, tw.Superseded())
	require.Zero(t, testutil.ToFloat64(opts.Metrics.duplicates), "nothing of the unsigned commit is held")
	require.Equal(t, "bob update configmaps demo/app", gitLog(t, gitDir, "main", "%an %s")[0])
	require.Contains(t, gitShow(t, gitDir, "main", "team/demo/core/configmaps/app.yaml"), "key: 2")
}
