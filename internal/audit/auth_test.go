package audit

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoadTokenFile(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string
		wantErr string
	}{
		{name: "tokens, comments and blank lines", content: "# audit tokens\n\ntok-one\n  tok-two  \r\n# old: tok-zero\n", want: []string{"tok-one", "tok-two"}},
		{name: "no trailing newline", content: "tok-one", want: []string{"tok-one"}},
		{name: "empty", content: "", wantErr: "no token"},
		{name: "only comments", content: "# nothing\n\n   \n", wantErr: "no token"},
		{name: "whitespace inside a token", content: "tok-one\nsecret-part other-part\n", wantErr: "line 2: a token may not contain whitespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tokens")
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			got, err := LoadTokenFile(path)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.NotContains(t, err.Error(), "secret-part", "errors never quote a token")
				return
			}
			require.NoError(t, err)
			var s []string
			for _, b := range got {
				s = append(s, string(b))
			}
			require.Equal(t, tt.want, s)
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := LoadTokenFile(filepath.Join(t.TempDir(), "absent"))
		require.ErrorContains(t, err, "unable to read audit token file")
	})
}

func TestAuthenticate(t *testing.T) {
	a := Authenticator{Tokens: [][]byte{[]byte("short"), []byte("a-much-longer-token")}}
	tests := []struct {
		name   string
		header string
		want   AuthMethod
	}{
		{name: "first token", header: "Bearer short", want: AuthToken},
		{name: "second token", header: "Bearer a-much-longer-token", want: AuthToken},
		{name: "surrounding spaces", header: "Bearer   short ", want: AuthToken},
		{name: "prefix of a token", header: "Bearer a-much", want: AuthNone},
		{name: "token plus suffix", header: "Bearer shortX", want: AuthNone},
		{name: "no scheme", header: "short", want: AuthNone},
		{name: "none", header: "", want: AuthNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/audit/x", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			got, ok := a.Authenticate(r)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.want != AuthNone, ok)
		})
	}
}
