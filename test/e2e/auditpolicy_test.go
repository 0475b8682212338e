package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// auditCapture stands in for kubescribe's audit endpoint, at its address, with its serving
// certificate and client CA: it keeps every batch the apiserver posts.
type auditCapture struct {
	mu      sync.Mutex
	batches [][]byte
}

func (c *auditCapture) all() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.batches...)
}

// events returns every event of every batch captured so far.
func (c *auditCapture) events(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, b := range c.all() {
		var list struct {
			Items []map[string]any `json:"items"`
		}
		require.NoError(t, json.Unmarshal(b, &list))
		out = append(out, list.Items...)
	}
	return out
}

// captureAudit stops kubescribe and serves its audit address itself until the test ends, when
// kubescribe is started again.
func captureAudit(t *testing.T) *auditCapture {
	t.Helper()
	require.NoError(t, env.StopKubescribe())
	t.Cleanup(func() { require.NoError(t, env.StartKubescribe(context.Background())) }) // runs after the server's Close
	cert, err := tls.LoadX509KeyPair(env.Audit.CertFile, env.Audit.KeyFile)
	require.NoError(t, err)
	caPEM, err := os.ReadFile(env.Audit.ClientCAFile)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	c := &auditCapture{}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "unreadable body", http.StatusBadRequest)
				return
			}
			c.mu.Lock()
			c.batches = append(c.batches, body)
			c.mu.Unlock()
		}),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}, // a token may come instead
	}
	var ln net.Listener
	require.Eventually(t, func() bool { // kubescribe's listener has just closed
		ln, err = tls.Listen("tcp", env.Audit.ListenAddr, srv.TLSConfig)
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "listening at the audit address: %v", err)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("audit capture: %v", err)
		}
	}()
	t.Cleanup(func() { _ = srv.Close() })
	return c
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// eventFor finds a captured ResponseComplete event of verb on resource/name.
func eventFor(events []map[string]any, verb, resource, name string) map[string]any {
	for _, e := range events {
		ref, _ := e["objectRef"].(map[string]any)
		if e["stage"] == "ResponseComplete" && e["verb"] == verb && ref["resource"] == resource && ref["name"] == name && ref["subresource"] == nil {
			return e
		}
	}
	return nil
}

// The printed audit policy, which the apiserver runs with, sends kubescribe no credential: a
// TokenRequest's issued token, the token a TokenReview checks, and the data of a Secret (a
// bootstrap token's too) written by create, update, patch and delete appear in no event the
// apiserver posts to kubescribe's audit endpoint; a later ConfigMap write arrives with its
// body (the capture works, and came after them).
func TestAuditPolicyLeaksNoCredential(t *testing.T) {
	ctx := context.Background()
	capture := captureAudit(t)
	admin := clientFor(t, "admin")
	ns := "e2e-auditpolicy"
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// No controller-manager runs: the ServiceAccount is made here.
	_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	require.NoError(t, err)
	token := tr.Status.Token
	require.NotEmpty(t, token)
	review, err := admin.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.True(t, review.Status.Authenticated, "the issued token is a real one")

	values := []string{"pw-create-" + randomHex(t), "pw-update-" + randomHex(t), "pw-patch-" + randomHex(t)}
	secrets := admin.CoreV1().Secrets(ns)
	s, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"password": values[0]}}, metav1.CreateOptions{})
	require.NoError(t, err)
	s.StringData = map[string]string{"password": values[1]}
	_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	patch, err := json.Marshal(map[string]any{"stringData": map[string]string{"password": values[2]}})
	require.NoError(t, err)
	_, err = secrets.Patch(ctx, "db", types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, secrets.Delete(ctx, "db", metav1.DeleteOptions{}))
	bootstrapSecret := randomHex(t)[:16]
	_, err = admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-e2eaud"}, Type: corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{"token-id": "e2eaud", "token-secret": bootstrapSecret, "usage-bootstrap-authentication": "true"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = admin.CoreV1().Secrets("kube-system").Delete(context.Background(), "bootstrap-token-e2eaud", metav1.DeleteOptions{})
	})
	values = append(values, bootstrapSecret)

	// The positive signal: a ConfigMap written after all of them arrives, with its body.
	_, err = admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-credentials"},
		Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	var events []map[string]any
	require.Eventually(t, func() bool {
		events = capture.events(t)
		return eventFor(events, "create", "configmaps", "after-credentials") != nil &&
			eventFor(events, "delete", "secrets", "db") != nil && eventFor(events, "create", "secrets", "bootstrap-token-e2eaud") != nil
	}, time.Minute, 100*time.Millisecond, "the apiserver posted the writes' events")
	cm := eventFor(events, "create", "configmaps", "after-credentials")
	require.Equal(t, "RequestResponse", cm["level"])
	require.NotNil(t, cm["responseObject"], "what kubescribe needs still arrives")
	require.Equal(t, "RequestResponse", eventFor(events, "create", "serviceaccounts", "robot")["level"])
	for _, verb := range []string{"create", "update", "patch", "delete"} {
		e := eventFor(events, verb, "secrets", "db")
		require.NotNil(t, e, "the Secret's %s is audited", verb)
		require.Equal(t, "Metadata", e["level"], verb)
		require.Nil(t, e["requestObject"], verb)
		require.Nil(t, e["responseObject"], verb)
	}
	for _, e := range events {
		ref, _ := e["objectRef"].(map[string]any)
		require.False(t, ref["resource"] == "serviceaccounts" && ref["subresource"] == "token", "no TokenRequest event: %v", e)
		require.False(t, ref["resource"] == "tokenreviews", "no TokenReview event: %v", e)
	}

	secretsOf := func(v string) [][]byte {
		return [][]byte{[]byte(v), []byte(base64.StdEncoding.EncodeToString([]byte(v)))}
	}
	forbidden := [][]byte{[]byte(token)}
	if parts := bytes.Split([]byte(token), []byte(".")); len(parts) == 3 {
		forbidden = append(forbidden, parts[2]) // the signature alone, however it is embedded
	}
	for _, v := range values {
		forbidden = append(forbidden, secretsOf(v)...)
	}
	batches := capture.all()
	require.NotEmpty(t, batches)
	for i, b := range batches {
		for _, f := range forbidden {
			require.False(t, bytes.Contains(b, f), "batch %d carries a credential (%d bytes)", i, len(f))
		}
	}
}
