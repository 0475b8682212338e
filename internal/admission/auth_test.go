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
	}}
	cert := func(cn string) *tls.ConnectionState {
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
	}
	body := review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false)
	for _, tc := range []struct {
		name string
		auth *reviewhttp.Auth
		path string
		tls  *tls.ConnectionState
		code int
	}{
		{name: "no credential", auth: auth, path: PathPrefix + "local", code: 401},
		{name: "no authenticator", path: PathPrefix + "local", tls: cert("kube-apiserver"), code: 401},
		{name: "wrong path token", auth: auth, path: PathPrefix + "tenant-a/guessed", code: 401},
		{name: "tenant token for the local route", auth: auth, path: PathPrefix + "local/tenant-token", code: 403},
		{name: "local certificate for a tenant route", auth: auth, path: PathPrefix + "tenant-a", tls: cert("kube-apiserver"), code: 403},
		{name: "tenant certificate for another tenant", auth: auth, path: PathPrefix + "tenant-a", tls: cert("tenant-b-apiserver"), code: 403},
		{name: "anonymous, opted out, for a tenant route", auth: anonymousLocal, path: PathPrefix + "tenant-a", code: 403},
		{name: "tenant token for its route", auth: auth, path: PathPrefix + "tenant-a/tenant-token", code: 200},
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
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, req)
			require.Equal(t, tc.code, w.Code, w.Body.String())
			require.NotContains(t, logs.String(), "tenant-token")
			if tc.code != http.StatusOK {
				require.Zero(t, r.n, "the body of a refused request is not read, nothing is queued")
				return
			}
			require.Contains(t, w.Body.String(), `"allowed":true`)
		})
	}
}
