package audit

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadTokenFile(t *testing.T) {
	type tok struct {
		value  string
		routes []string
		line   int
	}
	tests := []struct {
		name    string
		content string
		want    []tok
		wantErr string
	}{
		{name: "tokens, comments and blank lines", content: "# audit tokens\n\ntok-one\n  tok-two  \r\n# old: tok-zero\n",
			want: []tok{{"tok-one", []string{"here"}, 3}, {"tok-two", []string{"here"}, 4}}},
		{name: "no trailing newline", content: "tok-one", want: []tok{{"tok-one", []string{"here"}, 1}}},
		{name: "routes", content: "tok-one tenant-a\ntok-two\ttenant-a,tenant-b,tenant-a\n",
			want: []tok{{"tok-one", []string{"tenant-a"}, 1}, {"tok-two", []string{"tenant-a", "tenant-b"}, 2}}},
		{name: "empty", content: "", wantErr: "no token"},
		{name: "only comments", content: "# nothing\n\n   \n", wantErr: "no token"},
		{name: "spaces between routes", content: "tok-one\nsecret-part tenant-a, tenant-b\n", wantErr: "line 2: want `<token>` or `<token> <route>"},
		{name: "invalid route", content: "secret-part Tenant_A\n", wantErr: `line 1: route "Tenant_A" is not a DNS label`},
		{name: "empty route", content: "secret-part tenant-a,\n", wantErr: `line 1: route "" is not a DNS label`},
		{name: "token listed twice", content: "secret-part tenant-a\n\nsecret-part tenant-b\n", wantErr: "line 3: the token of line 1 is listed again"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens")
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			got, err := LoadTokenFile("audit token file", path, "here")
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.ErrorContains(t, err, path)
				require.NotContains(t, err.Error(), "secret-part", "errors never quote a token")
				return
			}
			require.NoError(t, err)
			var g []tok
			for _, x := range got {
				g = append(g, tok{string(x.Value), x.Routes, x.Line})
			}
			require.Equal(t, tt.want, g)
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := LoadTokenFile("audit token file", filepath.Join(t.TempDir(), "absent"), "here")
		require.ErrorContains(t, err, "unable to read audit token file")
	})
}

func TestParseCertRoutes(t *testing.T) {
	m, err := ParseCertRoutes("--audit-client-cert-routes", []string{"kube-apiserver-a=tenant-a", "CN with = and spaces=tenant-b,tenant-c"})
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"kube-apiserver-a": {"tenant-a"}, "CN with = and spaces": {"tenant-b", "tenant-c"}}, m)
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"no-routes"}, "want <common name>=<route>"},
		{[]string{"=tenant-a"}, "want <common name>=<route>"},
		{[]string{"cn=Bad_Route"}, `route "Bad_Route" is not a DNS label`},
		{[]string{"cn=a", "cn=b"}, `common name "cn" is bound twice`},
	} {
		_, err := ParseCertRoutes("--audit-client-cert-routes", tc.in)
		require.ErrorContains(t, err, tc.want, "%q", tc.in)
		require.ErrorContains(t, err, "--audit-client-cert-routes")
	}
}

func TestAuthenticate(t *testing.T) {
	a := Authenticator{
		LocalRoute: "local",
		Tokens: []Token{
			{Value: []byte("short"), Routes: []string{"local"}, Line: 1},
			{Value: []byte("a-much-longer-token"), Routes: []string{"tenant-a", "tenant-b"}, Line: 4},
		},
		CertRoutes: map[string][]string{"tenant-a-apiserver": {"tenant-a"}},
	}
	cert := func(cn string) *tls.ConnectionState {
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
	}
	tests := []struct {
		name   string
		header string
		tls    *tls.ConnectionState
		want   Caller
	}{
		{name: "first token", header: "Bearer short", want: Caller{Method: AuthToken, Name: "line 1", Routes: []string{"local"}}},
		{name: "second token", header: "Bearer a-much-longer-token", want: Caller{Method: AuthToken, Name: "line 4", Routes: []string{"tenant-a", "tenant-b"}}},
		{name: "surrounding spaces", header: "Bearer   short ", want: Caller{Method: AuthToken, Name: "line 1", Routes: []string{"local"}}},
		{name: "prefix of a token", header: "Bearer a-much"},
		{name: "token plus suffix", header: "Bearer shortX"},
		{name: "no scheme", header: "short"},
		{name: "none"},
		{name: "TLS without a verified certificate", tls: &tls.ConnectionState{}},
		{name: "mapped certificate", tls: cert("tenant-a-apiserver"), want: Caller{Method: AuthClientCert, Name: "tenant-a-apiserver", Routes: []string{"tenant-a"}}},
		{name: "unmapped certificate is local only", tls: cert("kube-apiserver"), want: Caller{Method: AuthClientCert, Name: "kube-apiserver", Routes: []string{"local"}}},
		{name: "a certificate wins over a token", tls: cert("kube-apiserver"), header: "Bearer a-much-longer-token",
			want: Caller{Method: AuthClientCert, Name: "kube-apiserver", Routes: []string{"local"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/audit/x", nil)
			r.TLS = tt.tls
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			got, ok := a.Authenticate(r)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.want.Method != AuthNone, ok)
		})
	}
}

func TestCallerMayPost(t *testing.T) {
	c := Caller{Method: AuthToken, Routes: []string{"tenant-a"}}
	require.True(t, c.MayPost("tenant-a"))
	require.False(t, c.MayPost("local"))
	require.False(t, c.MayPost(""))
	require.False(t, Caller{Routes: []string{"local"}}.MayPost("local"), "an unauthenticated caller may post nowhere")
	var zero Authenticator
	_, ok := zero.AuthenticateToken([]byte("anything"))
	require.False(t, ok)
}

// TestTokenFileReload: an Authenticator following a token file accepts the tokens of its
// current content once Reload read it; a content that does not load is reported once and the
// previous tokens stay in force.
func TestTokenFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		require.NoError(t, os.WriteFile(path+".new", []byte(s), 0o600))
		require.NoError(t, os.Rename(path+".new", path))
	}
	write("old-token\n")
	f, err := OpenTokenFile("audit token file", path, "local")
	require.NoError(t, err)
	a := Authenticator{LocalRoute: "local", TokenFile: f}
	accepts := func(token string) bool { _, ok := a.AuthenticateToken([]byte(token)); return ok }
	require.True(t, accepts("old-token"))

	changed, err := f.Reload()
	require.NoError(t, err)
	require.False(t, changed, "an unchanged file changes nothing")

	write("new-token\nold-token\ntenant-token tenant-a\n")
	changed, err = f.Reload()
	require.NoError(t, err)
	require.True(t, changed)
	require.True(t, accepts("new-token"))
	c, ok := a.AuthenticateToken([]byte("tenant-token"))
	require.True(t, ok)
	require.Equal(t, []string{"tenant-a"}, c.Routes)

	write("new-token\nsecret-part Not_A_Route\n")
	changed, err = f.Reload()
	require.ErrorContains(t, err, "line 2")
	require.NotContains(t, err.Error(), "secret-part")
	require.False(t, changed)
	require.True(t, accepts("old-token"), "a content that does not load leaves the previous tokens in force")
	changed, err = f.Reload()
	require.NoError(t, err, "the same content is reported once")
	require.False(t, changed)

	write("new-token\n")
	changed, err = f.Reload()
	require.NoError(t, err)
	require.True(t, changed)
	require.True(t, accepts("new-token"))
	require.False(t, accepts("old-token"), "a token removed from the file is refused")

	_, err = OpenTokenFile("audit token file", filepath.Join(t.TempDir(), "absent"), "local")
	require.ErrorContains(t, err, "unable to read audit token file")
}
