// Package secretenc turns the declared form of a Secret into a SOPS document that only the
// holders of its age identities can read: data and stringData values are encrypted, apiVersion,
// kind, metadata and type stay readable, and the sops block holds the age recipients and the
// MAC, as sops and Flux's kustomize-controller expect. It uses the sops and age libraries; the
// format is not written here.
//
// SOPS output is randomized (a new data key and IVs each time): two encryptions of one Secret
// differ, so the caller keeps a file while its Secret is unchanged (the watch: a resume cursor
// records what recipients a pushed file was sealed for).
package secretenc

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"filippo.io/age"
	"github.com/getsops/sops/v3"
	"github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keys"
	"github.com/getsops/sops/v3/keyservice"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
	"github.com/getsops/sops/v3/version"
)

// EncryptedRegex is the fields whose values are encrypted: the ones that hold a Secret's values.
// It is the setting Flux's documentation gives for Kubernetes Secrets.
const EncryptedRegex = "^(data|stringData)$"

// An Encrypter encrypts Secrets for a fixed set of age recipients.
type Encrypter struct {
	recipients []string // sorted, deduplicated
}

// NewEncrypter returns an Encrypter for recipients, age X25519 public keys ("age1…"). It refuses
// an empty list and any recipient age cannot parse.
func NewEncrypter(recipients []string) (*Encrypter, error) {
	if len(recipients) == 0 {
		return nil, errors.New("no age recipient")
	}
	var rs []string
	for _, r := range recipients {
		r = strings.TrimSpace(r)
		if _, err := age.ParseX25519Recipient(r); err != nil {
			return nil, fmt.Errorf("age recipient %q: %w", r, err)
		}
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return &Encrypter{recipients: slices.Compact(rs)}, nil
}

// Seal is Encrypt: an Encrypter is the watch's Sealer of a GitTarget's Secrets.
func (e *Encrypter) Seal(plain []byte) ([]byte, error) { return e.Encrypt(plain) }

// Recipients returns the recipients, sorted.
func (e *Encrypter) Recipients() []string { return slices.Clone(e.recipients) }

// Encrypt returns the SOPS document of plain, a Secret's declared form in YAML. Each call
// makes a new data key: two calls on one plaintext give different files.
func (e *Encrypter) Encrypt(plain []byte) ([]byte, error) {
	store := newStore()
	branches, err := store.LoadPlainFile(plain)
	if err != nil {
		// The parser's words may quote the document: they are left out.
		return nil, errors.New("read the Secret: not a YAML document sops can read")
	}
	if len(branches) != 1 {
		return nil, fmt.Errorf("the Secret is %d YAML documents, not one", len(branches))
	}
	group := make(sops.KeyGroup, 0, len(e.recipients))
	for _, r := range e.recipients {
		mk, err := sopsage.MasterKeyFromRecipient(r)
		if err != nil {
			return nil, fmt.Errorf("age recipient %q: %w", r, err)
		}
		group = append(group, keys.MasterKey(mk))
	}
	tree := sops.Tree{Branches: branches, Metadata: sops.Metadata{
		KeyGroups:      []sops.KeyGroup{group},
		EncryptedRegex: EncryptedRegex,
		Version:        version.Version,
	}}
	dataKey, errs := tree.GenerateDataKeyWithKeyServices([]keyservice.KeyServiceClient{keyservice.NewLocalClient()})
	if len(errs) > 0 {
		return nil, fmt.Errorf("encrypt the data key: %w", errors.Join(errs...))
	}
	cipher := aes.NewCipher()
	mac, err := tree.Encrypt(dataKey, cipher)
	if err != nil {
		return nil, fmt.Errorf("encrypt the values: %w", err)
	}
	tree.Metadata.LastModified = time.Now().UTC()
	if tree.Metadata.MessageAuthenticationCode, err = cipher.Encrypt(mac, dataKey, tree.Metadata.LastModified.Format(time.RFC3339)); err != nil {
		return nil, fmt.Errorf("encrypt the MAC: %w", err)
	}
	out, err := store.EmitEncryptedFile(tree)
	if err != nil {
		return nil, fmt.Errorf("write the SOPS document: %w", err)
	}
	return out, nil
}

func newStore() *sopsyaml.Store { return sopsyaml.NewStore(&config.YAMLStoreConfig{Indent: 2}) }

// A Digester computes keyed digests (HMAC-SHA-256) of Secrets' declared forms: what the
// admission tier and the watch compare to credit a Secret's write to its author, without a
// digest anyone could check against guessed values. Its key must stay secret.
type Digester struct{ key []byte }

// MinDigestKeySize is the shortest digest key accepted, in bytes.
const MinDigestKeySize = 32

// NewDigester returns a Digester with key (at least MinDigestKeySize bytes), kept in memory.
func NewDigester(key []byte) (*Digester, error) {
	if len(key) < MinDigestKeySize {
		return nil, fmt.Errorf("the digest key is %d bytes; it needs at least %d", len(key), MinDigestKeySize)
	}
	return &Digester{key: slices.Clone(key)}, nil
}

// Sum is the keyed digest of plain.
func (d *Digester) Sum(plain []byte) [32]byte {
	m := hmac.New(sha256.New, d.key)
	m.Write(plain)
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}
