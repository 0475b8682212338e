package keyspace

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr string
	}{
		{name: "default", in: "kubescribe", want: "kubescribe"},
		{name: "colon allowed", in: "team-a:kubescribe", want: "team-a:kubescribe"},
		{name: "trailing colon trimmed", in: "kubescribe:", want: "kubescribe"},
		{name: "several trailing colons trimmed", in: "ks:::", want: "ks"},
		{name: "dots and underscores", in: "prod.kube_scribe", want: "prod.kube_scribe"},
		{name: "empty", in: "", wantErr: "must not be empty"},
		{name: "only colons", in: ":::", wantErr: "must not be empty"},
		{name: "star", in: "kube*", wantErr: "glob"},
		{name: "question mark", in: "kube?", wantErr: "glob"},
		{name: "bracket", in: "kube[a]", wantErr: "glob"},
		{name: "backslash", in: `kube\x`, wantErr: "glob"},
		{name: "hash tag brace", in: "{kube}", wantErr: "hash-tag"},
		{name: "percent", in: "kube%d", wantErr: "'%'"},
		{name: "space", in: "kube scribe", wantErr: "whitespace"},
		{name: "newline", in: "kube\nscribe", wantErr: "whitespace"},
		{name: "non-ascii", in: "kübe", wantErr: "non-ASCII"},
		{name: "too long", in: string(make([]byte, 129)), wantErr: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.want == "" {
				require.Error(t, err)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got.String())
		})
	}
}

func TestTooLong(t *testing.T) {
	long := make([]byte, 129)
	for i := range long {
		long[i] = 'a'
	}
	_, err := Parse(string(long))
	require.ErrorContains(t, err, "longer than 128")
}

func TestKey(t *testing.T) {
	p := MustParse("team:ks:")
	require.Equal(t, "team:ks:fact:local:u1:42", p.Key("fact", "local", "u1", "42"))
	require.Equal(t, "team:ks", p.Key())
}
