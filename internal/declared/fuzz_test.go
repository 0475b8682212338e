package declared

import (
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// FuzzEncode: for any JSON object, decoded the way an unstructured object is, Encode does not
// panic or fail, renders the same bytes twice, and its YAML reads back as the object (exactly with
// go.yaml.in/yaml/v3; with sigs.k8s.io/yaml as exactly as JSON allows). Form is idempotent on it.
//
//	go test ./internal/declared/ -run '^$' -fuzz FuzzEncode -fuzztime 60s
func FuzzEncode(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err == nil {
			f.Add(data)
		}
	}
	for _, seed := range []string{
		`{}`,
		`{"a":1.0,"b":1,"c":-0,"d":1e3,"e":1.5e300,"f":9223372036854775807,"g":9223372036854775808}`,
		`{"s":["yes","no","on","0755","1_0","0x1f","2026-01-01","12:30","~","","<<",".inf","-.5","+1"]}`,
		`{"m":"a\nb ","n":"\n","o":" a\nb","p":"a\r\nb","q":"a\u2028b","r":"\t\n\t","s":"a\n\n","t":"#x\n- y"}`,
		`{"":{"":[]},"true":{"1":null},"a\nb":{"k":{}}}`,
		`{"metadata":{"name":"x","labels":{"kubernetes.io/metadata.name":"x"},"annotations":"bad"},"status":1}`,
		`{"k":"\u0000\u0085\ufeff\u00a0é"}`,
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		var m map[string]interface{}
		if err := utiljson.Unmarshal(data, &m); err != nil || m == nil {
			t.Skip()
		}
		obj := &unstructured.Unstructured{Object: m}

		out, err := Encode(obj)
		require.NoError(t, err)
		again, err := Encode(obj)
		require.NoError(t, err)
		require.Equal(t, string(out), string(again))

		byV3, err := decodeV3(out)
		require.NoError(t, err, "%s", out)
		require.Equal(t, m, byV3, "%s", out)

		bySigs, err := decodeSigs(out)
		require.NoError(t, err, "%s", out)
		require.Equal(t, viaJSON(t, m), bySigs, "%s", out)

		form := Form(obj)
		require.Equal(t, form, Form(form))
		_, err = Manifest(obj)
		require.NoError(t, err)
	})
}

// FuzzEncodeString aims the same property at the scalar rules: any valid UTF-8 string, as a value,
// as a list element and as a key, reads back as itself.
//
//	go test ./internal/declared/ -run '^$' -fuzz FuzzEncodeString -fuzztime 60s
func FuzzEncodeString(f *testing.F) {
	for _, seed := range []string{
		"", "yes", "0755", "1e3", "2026-01-01", "12:30", "a\nb", "a\nb\n", "a\n\n", "\n", " a\nb",
		"\ta\nb", "a \nb", "a\r\nb", "a\u2028b", "- a\n- b", "#c\n", "|\n", "'\"", "\ufeffx", "key: value",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		in := map[string]interface{}{"v": s, "l": []interface{}{s, "x"}, "m": map[string]interface{}{s: s}}
		out, err := Encode(&unstructured.Unstructured{Object: in})
		if !utf8.ValidString(s) {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)

		byV3, err := decodeV3(out)
		require.NoError(t, err, "%q\n%s", s, out)
		require.Equal(t, in, byV3, "%q\n%s", s, out)

		bySigs, err := decodeSigs(out)
		require.NoError(t, err, "%q\n%s", s, out)
		require.Equal(t, in, bySigs, "%q\n%s", s, out)
	})
}
