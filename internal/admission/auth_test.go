package admission

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// anonymousLocal serves the tests' plain-HTTP requests as the local cluster's apiserver.
var anonymousLocal = &reviewhttp.Auth{AllowUnauthenticated: true, Callers: audit.Authenticator{LocalRoute: "local"}}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// Every caller is authenticated (401) and bound to the route it posts for (403), before the
// body is read.
func TestAuthentication(t *testing.T) {
	auth := &reviewhttp.Auth{Callers: audit.Authenticator{
		LocalRoute: "local",
		Tokens:     []audit.Token{{Value: []byte("tenant-token"), Routes: []string{"tenant-a"}, Line: 3}},
		CertRoutes: map[string][]string{"tenant-b-apiserver": {"tenant-b"}},
	}, CertWebhooks: map[string][]string{"commitrequests-only": {reviewhttp.WebhookCommitRequests}}}
	tenantToken := reviewhttp.WebhookToken([]byte("tenant-token"), reviewhttp.WebhookAttribution)
	tenantCRToken := reviewhttp.WebhookToken([]byte("tenant-token"), reviewhttp.WebhookCommitRequests)
	cert := func(cn string) *tls.ConnectionState {
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
	}
	body := review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false)
	for _, tc := range []struct {
		name   string
		auth   *reviewhttp.Auth
		path   string
		tls    *tls.ConnectionState
		bearer string
		code   int
	}{
		{name: "no credential", auth: auth, path: PathPrefix + "local", code: 401},
		{name: "no authenticator", path: PathPrefix + "local", tls: cert("kube-apiserver"), code: 401},
		{name: "wrong path token", auth: auth, path: PathPrefix + "tenant-a/guessed", code: 401},
		{name: "tenant token for the local route", auth: auth, path: PathPrefix + "local/" + tenantToken, code: 403},
		// Finding 2 of issue 36: the CommitRequest webhook's token leaks to CommitRequest
		// creators (the apiserver quotes its URL in errors); it never opens this webhook.
		{name: "the CommitRequest webhook's token in the path", auth: auth, path: PathPrefix + "tenant-a/" + tenantCRToken, code: 401},
		{name: "the CommitRequest webhook's token as a bearer token", auth: auth, path: PathPrefix + "tenant-a", bearer: tenantCRToken, code: 401},
		{name: "the secret itself in the path", auth: auth, path: PathPrefix + "tenant-a/tenant-token", code: 401},
		{name: "the secret as a bearer token", auth: auth, path: PathPrefix + "tenant-a", bearer: "tenant-token", code: 200},
		{name: "tenant token as a bearer token", auth: auth, path: PathPrefix + "tenant-a", bearer: tenantToken, code: 200},
		{name: "a certificate bound to the CommitRequest webhook", auth: auth, path: PathPrefix + "local", tls: cert("commitrequests-only"), code: 403},
		{name: "local certificate for a tenant route", auth: auth, path: PathPrefix + "tenant-a", tls: cert("kube-apiserver"), code: 403},
		{name: "tenant certificate for another tenant", auth: auth, path: PathPrefix + "tenant-a", tls: cert("tenant-b-apiserver"), code: 403},
		{name: "anonymous, opted out, for a tenant route", auth: anonymousLocal, path: PathPrefix + "tenant-a", code: 403},
		{name: "tenant token for its route", auth: auth, path: PathPrefix + "tenant-a/" + tenantToken, code: 200},
		{name: "tenant certificate for its route", auth: auth, path: PathPrefix + "tenant-b", tls: cert("tenant-b-apiserver"), code: 200},
		{name: "local certificate", auth: auth, path: PathPrefix + "local", tls: cert("kube-apiserver"), code: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &bytes.Buffer{}
			f := newFixture(t, func(o *HandlerOptions) {
				o.Auth, o.Logger = tc.auth, slog.New(slog.NewTextHandler(logs, nil))
			}, false)
			r := &countingReader{r: bytes.NewReader([]byte(body))}
			req := httptest.NewRequest(http.MethodPost, tc.path, r)
			req.TLS = tc.tls
			if tc.bearer != "" {
				req.Header.Set("Authorization", "Bearer "+tc.bearer)
			}
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, req)
			require.Equal(t, tc.code, w.Code, w.Body.String())
			require.NotContains(t, logs.String(), "tenant-token")
			require.NotContains(t, logs.String(), tenantToken)
			require.NotContains(t, logs.String(), tenantCRToken)
			if tc.code != http.StatusOK {
				require.Zero(t, r.n, "the body of a refused request is not read, nothing is queued")
				return
			}
			require.Contains(t, w.Body.String(), `"allowed":true`)
		})
	}
}
