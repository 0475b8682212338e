package secretenc

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"filippo.io/age"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/decrypt"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

const secret = `apiVersion: v1
kind: Secret
metadata:
  name: db
  namespace: demo
  labels:
    app: db
type: Opaque
data:
  password: aHVudGVyMg==
stringData:
  user: admin-xq7
`

// newIdentity returns an age identity and its recipient; the identity is handed to sops's
// decryption through SOPS_AGE_KEY, as a user's key file would be.
func newIdentity(t *testing.T) (*age.X25519Identity, string) {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	return id, id.Recipient().String()
}

func decryptAs(t *testing.T, file []byte, ids ...*age.X25519Identity) ([]byte, error) {
	t.Helper()
	var keys []string
	for _, id := range ids {
		keys = append(keys, id.String())
	}
	t.Setenv("SOPS_AGE_KEY", strings.Join(keys, "\n"))
	t.Setenv("SOPS_AGE_KEY_FILE", "/nonexistent")
	return decrypt.Data(file, "yaml")
}

// The document keeps the Secret's shape readable and its values encrypted; sops decrypts it back
// to the Secret with either recipient's identity, and not with another one.
func TestEncryptGivesADocumentSopsDecrypts(t *testing.T) {
	alice, aliceR := newIdentity(t)
	flux, fluxR := newIdentity(t)
	stranger, _ := newIdentity(t)
	e, err := NewEncrypter([]string{fluxR, aliceR, aliceR})
	require.NoError(t, err)
	file, err := e.Encrypt([]byte(secret))
	require.NoError(t, err)

	for _, plain := range []string{"aHVudGVyMg==", "admin-xq7", "hunter2"} {
		require.NotContains(t, string(file), plain)
	}
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(file, &doc))
	require.Equal(t, "v1", doc["apiVersion"])
	require.Equal(t, "Secret", doc["kind"])
	require.Equal(t, "Opaque", doc["type"])
	require.Equal(t, map[string]any{"name": "db", "namespace": "demo", "labels": map[string]any{"app": "db"}}, doc["metadata"])
	require.True(t, strings.HasPrefix(doc["data"].(map[string]any)["password"].(string), "ENC[AES256_GCM,"))
	meta := doc["sops"].(map[string]any)
	require.Equal(t, EncryptedRegex, meta["encrypted_regex"])
	require.NotEmpty(t, meta["mac"])
	rs, err := fileRecipients(file)
	require.NoError(t, err)
	require.Equal(t, e.Recipients(), rs)
	require.Len(t, rs, 2)
	require.True(t, isEncrypted(file))
	require.False(t, isEncrypted([]byte(secret)))

	for _, id := range []*age.X25519Identity{alice, flux} {
		plain, err := decryptAs(t, file, id)
		require.NoError(t, err)
		require.YAMLEq(t, secret, string(plain))
	}
	_, err = decryptAs(t, file, stranger)
	require.Error(t, err)

	// A value changed in the file breaks the MAC: sops refuses it.
	tampered := bytes.Replace(file, []byte("name: db"), []byte("name: dc"), 1)
	_, err = decryptAs(t, tampered, alice)
	require.ErrorContains(t, err, "mac")
}

func TestNewEncrypterRefusesBadRecipients(t *testing.T) {
	_, err := NewEncrypter(nil)
	require.ErrorContains(t, err, "no age recipient")
	_, err = NewEncrypter([]string{"age1notakey"})
	require.ErrorContains(t, err, `age recipient "age1notakey"`)
	_, err = NewEncrypter([]string{"ssh-ed25519 AAAA"})
	require.Error(t, err)
}

// fileRecipients reads the age recipients of a SOPS document, sorted, without decrypting
// anything.
func fileRecipients(file []byte) ([]string, error) {
	tree, err := newStore().LoadEncryptedFile(file)
	if err != nil {
		return nil, fmt.Errorf("read the SOPS document: %w", err)
	}
	var rs []string
	for _, g := range tree.Metadata.KeyGroups {
		for _, k := range g {
			mk, ok := k.(*sopsage.MasterKey)
			if !ok {
				return nil, fmt.Errorf("the SOPS document has a %s key, not only age", k.TypeToIdentifier())
			}
			rs = append(rs, mk.Recipient)
		}
	}
	slices.Sort(rs)
	return slices.Compact(rs), nil
}

// isEncrypted reports whether file is a SOPS document (it has a sops block with a MAC).
func isEncrypted(file []byte) bool {
	tree, err := newStore().LoadEncryptedFile(file)
	return err == nil && tree.Metadata.MessageAuthenticationCode != ""
}

// A digest depends on its key: without the key, it cannot be checked against a guess.
func TestDigestIsKeyed(t *testing.T) {
	d1, err := NewDigester(bytes.Repeat([]byte{1}, 32))
	require.NoError(t, err)
	d2, err := NewDigester(bytes.Repeat([]byte{2}, 32))
	require.NoError(t, err)
	require.Equal(t, d1.Sum([]byte(secret)), d1.Sum([]byte(secret)))
	require.NotEqual(t, d1.Sum([]byte(secret)), d2.Sum([]byte(secret)))
	require.NotEqual(t, d1.Sum([]byte(secret)), d1.Sum([]byte(secret+" ")))
	_, err = NewDigester(make([]byte, 16))
	require.ErrorContains(t, err, "at least 32")
}
