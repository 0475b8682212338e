package git

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/hiddeco/sshsig"
	"golang.org/x/crypto/ssh"
)

// A Signer signs the commits a worker makes. Git keeps the signature in the commit's gpgsig
// header, whatever its format: an armored OpenPGP signature (gpg.format=openpgp) or an armored
// SSH signature in the "git" namespace (gpg.format=ssh), which `git verify-commit` checks with
// gpg or with ssh-keygen and an allowed-signers file.
//
// A Signer is shared by the workers of every branch of a provider; Sign may be called from
// several goroutines at once. Its String names the key (format and fingerprint), never the key.
type Signer interface {
	// Sign returns the armored signature of payload: a commit encoded without its signature.
	Sign(payload []byte) (string, error)
	// Key names the key: its format and public fingerprint. Two Signers with the same Key sign
	// with the same key.
	Key() string
	// Verify reports whether signature is this key's signature of payload.
	Verify(payload []byte, signature string) bool
}

// Signing-key formats, as git's gpg.format names them.
const (
	SigningFormatSSH     = "ssh"
	SigningFormatOpenPGP = "openpgp"
)

// sshSigNamespace is the namespace git signs commits in (ssh-keygen -Y sign -n git).
const sshSigNamespace = "git"

// ParseSigningKey reads a private signing key: an OpenSSH private key ("-----BEGIN OPENSSH
// PRIVATE KEY-----", or a PEM RSA, EC or PKCS#8 key) or an armored OpenPGP secret key ("-----BEGIN
// PGP PRIVATE KEY BLOCK-----"). passphrase decrypts a protected key (empty: none). The key is
// proven by signing a probe; an error says why it cannot sign and never quotes the key.
func ParseSigningKey(key, passphrase []byte) (Signer, error) {
	trimmed := bytes.TrimSpace(key)
	if len(trimmed) == 0 {
		return nil, errors.New("the signing key is empty")
	}
	var s Signer
	var err error
	if bytes.HasPrefix(trimmed, []byte("-----BEGIN PGP PRIVATE KEY BLOCK-----")) {
		s, err = parseOpenPGPKey(trimmed, passphrase)
	} else if bytes.HasPrefix(trimmed, []byte("-----BEGIN PGP PUBLIC KEY BLOCK-----")) || bytes.HasPrefix(trimmed, []byte("ssh-")) ||
		bytes.HasPrefix(trimmed, []byte("ecdsa-")) {
		return nil, errors.New("the signing key is a public key: the Secret needs the private key")
	} else if bytes.HasPrefix(trimmed, []byte("-----BEGIN ")) {
		s, err = parseSSHKey(trimmed, passphrase)
	} else {
		return nil, errors.New("the signing key is neither an OpenSSH or PEM private key nor an armored OpenPGP private key")
	}
	if err != nil {
		return nil, err
	}
	if _, err := s.Sign([]byte("kubescribe signing probe\n")); err != nil {
		return nil, fmt.Errorf("the %s cannot sign: %w", s.Key(), err)
	}
	return s, nil
}

// sshSigner signs with an SSH private key, in the sshsig format.
type sshSigner struct {
	signer ssh.Signer
	key    string
}

func parseSSHKey(key, passphrase []byte) (Signer, error) {
	var signer ssh.Signer
	var err error
	if len(passphrase) > 0 {
		signer, err = ssh.ParsePrivateKeyWithPassphrase(key, passphrase)
	} else {
		signer, err = ssh.ParsePrivateKey(key)
	}
	var missing *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &missing):
		return nil, errors.New("the SSH signing key is protected by a passphrase, and the Secret holds none")
	case errors.Is(err, x509.IncorrectPasswordError):
		return nil, errors.New("the SSH signing key's passphrase is wrong")
	case err != nil:
		// ssh's parse errors name the key type or the PEM block, never key material.
		return nil, fmt.Errorf("the SSH signing key cannot be read: %v", err)
	}
	pub := signer.PublicKey()
	return &sshSigner{signer: signer, key: fmt.Sprintf("SSH %s key %s", pub.Type(), ssh.FingerprintSHA256(pub))}, nil
}

func (s *sshSigner) Sign(payload []byte) (string, error) {
	sig, err := sshsig.Sign(bytes.NewReader(payload), s.signer, sshsig.HashSHA512, sshSigNamespace)
	if err != nil {
		return "", err
	}
	return string(sshsig.Armor(sig)), nil
}

func (s *sshSigner) Verify(payload []byte, signature string) bool {
	sig, err := sshsig.Unarmor([]byte(signature))
	if err != nil {
		return false
	}
	return sshsig.Verify(bytes.NewReader(payload), sig, s.signer.PublicKey(), sig.HashAlgorithm, sshSigNamespace) == nil
}

func (s *sshSigner) Key() string    { return s.key }
func (s *sshSigner) String() string { return s.key }

// openPGPSigner signs with an OpenPGP secret key: a detached, armored signature.
type openPGPSigner struct {
	mu     sync.Mutex
	entity *openpgp.Entity
	key    string
}

func parseOpenPGPKey(key, passphrase []byte) (Signer, error) {
	ring, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(key))
	if err != nil {
		return nil, fmt.Errorf("the OpenPGP signing key cannot be read: %v", err)
	}
	if len(ring) != 1 {
		return nil, fmt.Errorf("the OpenPGP signing key block holds %d keys; it must hold one", len(ring))
	}
	e := ring[0]
	name := fmt.Sprintf("OpenPGP key %X", e.PrimaryKey.Fingerprint)
	if e.PrivateKey == nil {
		return nil, fmt.Errorf("the %s has no secret part", name)
	}
	if _, ok := e.SigningKey(time.Now()); !ok {
		return nil, fmt.Errorf("the %s has no valid signing key (expired, revoked, or without the signing flag)", name)
	}
	if e.PrivateKey.Encrypted || anySubkeyEncrypted(e) {
		if len(passphrase) == 0 {
			return nil, fmt.Errorf("the %s is protected by a passphrase, and the Secret holds none", name)
		}
		if err := e.DecryptPrivateKeys(passphrase); err != nil {
			return nil, fmt.Errorf("the %s's passphrase is wrong", name)
		}
	}
	return &openPGPSigner{entity: e, key: name}, nil
}

func anySubkeyEncrypted(e *openpgp.Entity) bool {
	for _, sk := range e.Subkeys {
		if sk.PrivateKey != nil && sk.PrivateKey.Encrypted {
			return true
		}
	}
	return false
}

func (s *openPGPSigner) Sign(payload []byte) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out strings.Builder
	if err := openpgp.ArmoredDetachSign(&out, s.entity, bytes.NewReader(payload), &packet.Config{}); err != nil {
		return "", err
	}
	return out.String(), nil
}

func (s *openPGPSigner) Verify(payload []byte, signature string) bool {
	_, err := openpgp.CheckArmoredDetachedSignature(openpgp.EntityList{s.entity}, bytes.NewReader(payload), strings.NewReader(signature), nil)
	return err == nil
}

func (s *openPGPSigner) Key() string    { return s.key }
func (s *openPGPSigner) String() string { return s.key }

// refusingSigner stands for a signing key that is configured but cannot sign: every commit
// fails to build, with reason, so that nothing is pushed unsigned and the changes stay held
// until a key that signs is given.
type refusingSigner struct{ reason string }

// RefusingSigner returns a Signer that refuses to sign, saying reason.
func RefusingSigner(reason string) Signer { return refusingSigner{reason: reason} }

func (s refusingSigner) Sign([]byte) (string, error) {
	return "", fmt.Errorf("commits must be signed, and the signing key cannot sign: %s", s.reason)
}

func (s refusingSigner) Key() string { return "no usable key (" + s.reason + ")" }

func (s refusingSigner) Verify([]byte, string) bool { return false }

// signerKey names s for comparisons; "" for none.
func signerKey(s Signer) string {
	if s == nil {
		return ""
	}
	return s.Key()
}

// signCommit sets c's signature: s's signature of c encoded without one. A nil s leaves c
// unsigned.
func signCommit(c *object.Commit, s Signer) error {
	if s == nil {
		return nil
	}
	c.PGPSignature = ""
	payload, err := signedPayload(c)
	if err != nil {
		return fmt.Errorf("encode commit to sign: %w", err)
	}
	sig, err := s.Sign(payload)
	if err != nil {
		return fmt.Errorf("sign commit: %w", err)
	}
	c.PGPSignature = sig
	return nil
}

// signedPayload is c encoded without its signature: what a signature of c signs.
func signedPayload(c *object.Commit) ([]byte, error) {
	var unsigned plumbing.MemoryObject
	if err := c.EncodeWithoutSignature(&unsigned); err != nil {
		return nil, err
	}
	r, err := unsigned.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var payload bytes.Buffer
	if _, err := payload.ReadFrom(r); err != nil {
		return nil, err
	}
	return payload.Bytes(), nil
}

// signedBy reports whether c carries s's signature; with no s (signing is not configured),
// whether c is any commit at all. What a commit's trailers say (its writer epoch, the changes it
// carries) is believed only of a commit signedBy the worker's key: anyone with push access can
// write trailers, only kubescribe holds the key.
func signedBy(c *object.Commit, s Signer) bool {
	if s == nil {
		return true
	}
	if c.PGPSignature == "" {
		return false
	}
	payload, err := signedPayload(c)
	return err == nil && s.Verify(payload, c.PGPSignature)
}

// Refuses reports whether s is a RefusingSigner.
func Refuses(s Signer) bool {
	_, ok := s.(refusingSigner)
	return ok
}
