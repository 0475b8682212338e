package gittest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// A Verifier checks commit signatures with the real git, as a user who trusts one key would:
// for an SSH key, git's gpg.format=ssh with an allowed-signers file (ssh-keygen -Y verify); for
// an OpenPGP key, gpg with the public key imported into a keyring of its own.
type Verifier struct {
	config []string // git -c options
	env    []string
}

// SSHVerifier trusts pub for signatures of commits whose committer is email.
func SSHVerifier(t testing.TB, email string, pub ssh.PublicKey) Verifier {
	t.Helper()
	allowed := filepath.Join(t.TempDir(), "allowed_signers")
	line := email + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + "\n"
	require.NoError(t, os.WriteFile(allowed, []byte(line), 0o600))
	return Verifier{config: []string{"-c", "gpg.format=ssh", "-c", "gpg.ssh.allowedSignersFile=" + allowed}}
}

// OpenPGPVerifier trusts the armored public key pub, imported into a new gpg home.
func OpenPGPVerifier(t testing.TB, pub []byte) Verifier {
	t.Helper()
	home, err := os.MkdirTemp("", "gnupg") // gpg-agent's socket path must stay short
	require.NoError(t, err)
	require.NoError(t, os.Chmod(home, 0o700))
	t.Cleanup(func() {
		_ = exec.Command("gpgconf", "--homedir", home, "--kill", "all").Run()
		_ = os.RemoveAll(home)
	})
	cmd := exec.Command("gpg", "--homedir", home, "--batch", "--import")
	cmd.Stdin = bytes.NewReader(pub)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "gpg --import: %s", out)
	return Verifier{config: []string{"-c", "gpg.format=openpgp"}, env: []string{"GNUPGHOME=" + home}}
}

// Verify runs `git verify-commit` on rev of the repository at gitDir and returns its output and
// error (nil when the signature is good and made by the trusted key).
func (v Verifier) Verify(gitDir, rev string) (string, error) {
	args := append([]string{"--git-dir=" + gitDir}, v.config...)
	args = append(args, "verify-commit", "--raw", rev)
	cmd := exec.Command("git", args...)
	cmd.Env = append(append(os.Environ(), "GIT_TERMINAL_PROMPT=0"), v.env...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// NewOpenPGPKey returns a new OpenPGP key for name <email>: the armored secret key (encrypted
// with passphrase when it is not empty) and the armored public key.
func NewOpenPGPKey(t testing.TB, name, email, passphrase string) (secret, public []byte) {
	t.Helper()
	e, err := openpgp.NewEntity(name, "", email, &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	require.NoError(t, err)
	var pub bytes.Buffer
	w, err := armor.Encode(&pub, openpgp.PublicKeyType, nil)
	require.NoError(t, err)
	require.NoError(t, e.Serialize(w))
	require.NoError(t, w.Close())
	if passphrase != "" {
		require.NoError(t, e.EncryptPrivateKeys([]byte(passphrase), nil))
	}
	var sec bytes.Buffer
	w, err = armor.Encode(&sec, openpgp.PrivateKeyType, nil)
	require.NoError(t, err)
	if passphrase != "" {
		require.NoError(t, e.SerializePrivateWithoutSigning(w, nil))
	} else {
		require.NoError(t, e.SerializePrivate(w, nil))
	}
	require.NoError(t, w.Close())
	return sec.Bytes(), pub.Bytes()
}
