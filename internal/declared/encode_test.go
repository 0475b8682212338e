package declared

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func encode(t *testing.T, o obj) string {
	t.Helper()
	out, err := Encode(&unstructured.Unstructured{Object: o})
	require.NoError(t, err)
	return string(out)
}

func TestEncodeKeyOrder(t *testing.T) {
	got := encode(t, obj{
		"status": obj{"b": int64(1), "a": int64(2)},
		"spec":   obj{"zeta": "z", "alpha": "a", "Beta": "b", "_x": "x"},
		"data":   obj{"b": "2", "a": "1"},
		"metadata": obj{
			"uid":         "u",
			"annotations": obj{"z": "1", "a": "2"},
			"labels":      obj{"y": "y", "b": "b"},
			"namespace":   "ns",
			"name":        "cm",
		},
		"kind":       "ConfigMap",
		"apiVersion": "v1",
		"binaryData": obj{},
	})
	require.Equal(t, `apiVersion: v1
kind: ConfigMap
metadata:
  name: cm
  namespace: ns
  labels:
    b: b
    "y": "y"
  annotations:
    a: "2"
    z: "1"
  uid: u
binaryData: {}
data:
  a: "1"
  b: "2"
spec:
  Beta: b
  _x: x
  alpha: a
  zeta: z
status:
  a: 2
  b: 1
`, got)
}

// Only the top level and its metadata have a fixed order; a nested "metadata" is sorted.
func TestEncodeNestedMetadataSorted(t *testing.T) {
	got := encode(t, obj{"spec": obj{"template": obj{"metadata": obj{"name": "x", "labels": obj{"a": "b"}}}}})
	require.Equal(t, "spec:\n  template:\n    metadata:\n      labels:\n        a: b\n      name: x\n", got)
}

func TestEncodeScalars(t *testing.T) {
	tests := []struct {
		name string
		in   interface{}
		want string // the rendering of `v: <in>`
	}{
		{"plain string", "hello world", "v: hello world\n"},
		{"quantity", "100m", "v: 100m\n"},
		{"image", "nginx:1.27", "v: nginx:1.27\n"},
		{"ip address", "10.96.0.1", "v: 10.96.0.1\n"},
		{"version", "v1.2.3", "v: v1.2.3\n"},
		{"true", "true", "v: \"true\"\n"},
		{"False", "False", "v: \"False\"\n"},
		{"yes", "yes", "v: \"yes\"\n"},
		{"no", "no", "v: \"no\"\n"},
		{"on", "on", "v: \"on\"\n"},
		{"OFF", "OFF", "v: \"OFF\"\n"},
		{"y", "y", "v: \"y\"\n"},
		{"null", "null", "v: \"null\"\n"},
		{"tilde", "~", "v: \"~\"\n"},
		{"empty string", "", "v: \"\"\n"},
		{"integer", "1", "v: \"1\"\n"},
		{"negative integer", "-42", "v: \"-42\"\n"},
		{"octal-looking", "0755", "v: \"0755\"\n"},
		{"octal 1.2", "0o755", "v: \"0o755\"\n"},
		{"hex", "0x1F", "v: \"0x1F\"\n"},
		{"binary", "0b101", "v: \"0b101\"\n"},
		{"underscored int", "1_000", "v: \"1_000\"\n"},
		{"float", "1.5", "v: \"1.5\"\n"},
		{"leading dot float", ".5", "v: \".5\"\n"},
		{"exponent", "1e3", "v: \"1e3\"\n"},
		{"huge integer", "123456789012345678901234567890", "v: \"123456789012345678901234567890\"\n"},
		{"infinity", ".inf", "v: \".inf\"\n"},
		{"negative infinity", "-.Inf", "v: \"-.Inf\"\n"},
		{"not a number", ".NaN", "v: \".NaN\"\n"},
		{"date", "2026-04-01", "v: \"2026-04-01\"\n"},
		{"timestamp", "2026-04-01T10:00:00Z", "v: \"2026-04-01T10:00:00Z\"\n"},
		{"sexagesimal", "02:30", "v: \"02:30\"\n"},
		{"merge key", "<<", "v: \"<<\"\n"},
		{"leading space", " x", "v: ' x'\n"},
		{"indicator", "*star", "v: '*star'\n"},
		{"colon space", "a: b", "v: 'a: b'\n"},
		{"comment", "a #b", "v: 'a #b'\n"},
		{"multi-line", "a\nb\n", "v: |\n  a\n  b\n"},
		{"multi-line, no final newline", "a\nb", "v: |-\n  a\n  b\n"},
		{"multi-line, extra final newlines", "a\nb\n\n", "v: |+\n  a\n  b\n\n"},
		{"multi-line, indented first line", "  a\nb\n", "v: |2\n    a\n  b\n"},
		{"multi-line, trailing space on a line", "a \nb\n", "v: \"a \\nb\\n\"\n"},
		{"carriage return", "a\r\nb", "v: \"a\\r\\nb\"\n"},
		{"line separator", "a\u2028b", "v: \"a\\Lb\"\n"},
		{"tab", "a\tb", "v: \"a\\tb\"\n"},
		{"multi-line, tab inside", "a\n\tb\n", "v: |\n  a\n  \tb\n"},
		{"multi-line, leading tab", "\ta\nb", "v: \"\\ta\\nb\"\n"},
		{"plain yaml 1.1 bool n", "n", "v: \"n\"\n"},
		{"unicode", "grüße ✓", "v: grüße ✓\n"},
		{"control character", "a\x01b", "v: \"a\\x01b\"\n"},
		{"int64", int64(42), "v: 42\n"},
		{"int64 zero", int64(0), "v: 0\n"},
		{"max int64", int64(math.MaxInt64), "v: 9223372036854775807\n"},
		{"min int64", int64(math.MinInt64), "v: -9223372036854775808\n"},
		{"float64", 0.25, "v: 0.25\n"},
		{"integral float64", float64(3), "v: 3.0\n"},
		{"negative integral float64", float64(-2), "v: -2.0\n"},
		{"large float64", 1e21, "v: 1e+21\n"},
		{"small float64", 1e-7, "v: 1e-07\n"},
		{"json.Number int", json.Number("7"), "v: 7\n"},
		{"json.Number float", json.Number("7.0"), "v: 7.0\n"},
		{"int", 5, "v: 5\n"},
		{"int32", int32(-5), "v: -5\n"},
		{"uint64", uint64(math.MaxUint64), "v: 18446744073709551615\n"},
		{"float32", float32(0.1), "v: 0.1\n"},
		{"true bool", true, "v: true\n"},
		{"false bool", false, "v: false\n"},
		{"null", nil, "v: null\n"},
		{"empty map", obj{}, "v: {}\n"},
		{"empty list", list{}, "v: []\n"},
		{"nil map", map[string]interface{}(nil), "v: null\n"},
		{"list keeps order", list{"b", "a", int64(1), list{}, obj{}}, "v:\n  - b\n  - a\n  - 1\n  - []\n  - {}\n"},
		{"list of maps", list{obj{"name": "x", "a": ""}}, "v:\n  - a: \"\"\n    name: x\n"},
		{"map[string]string", map[string]string{"b": "1", "a": "x"}, "v:\n  a: x\n  b: \"1\"\n"},
		{"[]string", []string{"true", "x"}, "v:\n  - \"true\"\n  - x\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := encode(t, obj{"v": tt.in})
			require.Equal(t, tt.want, got)
		})
	}
}

// A long line is never folded.
func TestEncodeNoLineWrapping(t *testing.T) {
	long := strings.Repeat("word ", 60) + "end"
	require.Equal(t, "v: "+long+"\n", encode(t, obj{"v": long}))
}

func TestEncodeQuotesKeys(t *testing.T) {
	got := encode(t, obj{"data": obj{"true": "a", "1": "b", "": "c", "<<": "d", "a\nb": "e", "plain": "f"}})
	require.Equal(t, `data:
  "": c
  "1": b
  "<<": d
  ? "a\nb"
  : e
  plain: f
  "true": a
`, got)
}

func TestEncodeStable(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			first, err := Manifest(f.obj)
			require.NoError(t, err)
			for range 5 {
				again, err := Manifest(f.obj)
				require.NoError(t, err)
				require.Equal(t, string(first), string(again))
			}
			// The same content built afresh (new maps, new insertion order) renders the same.
			clone, err := decodeSigs(first)
			require.NoError(t, err)
			fromClone, err := Encode(&unstructured.Unstructured{Object: clone})
			require.NoError(t, err)
			require.Equal(t, string(first), string(fromClone))
			require.True(t, strings.HasSuffix(string(first), "\n"))
			require.False(t, strings.HasSuffix(string(first), "\n\n"))
		})
	}
}

// The round-trip property over every fixture: the YAML reads back as the declared form, exactly,
// both with sigs.k8s.io/yaml (what kubectl and the controllers use) and with go.yaml.in/yaml/v3.
func TestManifestRoundTrip(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			want := Form(f.obj).Object
			out, err := Manifest(f.obj)
			require.NoError(t, err)

			bySigs, err := decodeSigs(out)
			require.NoError(t, err)
			require.Equal(t, want, bySigs)

			byV3, err := decodeV3(out)
			require.NoError(t, err)
			require.Equal(t, want, byV3)
		})
	}
}

// int64 and float64 stay apart in the YAML text. sigs.k8s.io/yaml goes through JSON, where 3.0
// and 3 are one number, so there an integral float comes back as the int it equals.
func TestEncodeNumbersRoundTrip(t *testing.T) {
	in := obj{
		"ints":   list{int64(0), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), int64(1 << 53), int64(1<<53 + 1)},
		"floats": list{0.5, -0.5, float64(3), float64(-0), 1e21, 1e-7, math.MaxFloat64, math.SmallestNonzeroFloat64, 0.1 + 0.2},
	}
	out, err := Encode(&unstructured.Unstructured{Object: in})
	require.NoError(t, err)

	byV3, err := decodeV3(out)
	require.NoError(t, err)
	require.Equal(t, in, byV3)

	bySigs, err := decodeSigs(out)
	require.NoError(t, err)
	require.Equal(t, viaJSON(t, in), bySigs)
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   obj
		want string
	}{
		{"NaN", obj{"spec": obj{"x": math.NaN()}}, "spec.x: NaN has no JSON form"},
		{"infinity", obj{"spec": obj{"l": list{math.Inf(1)}}}, "spec.l.[0]: +Inf has no JSON form"},
		{"invalid UTF-8 value", obj{"data": obj{"k": "\xff"}}, "data.k: invalid UTF-8"},
		{"invalid UTF-8 key", obj{"data": obj{"\xff": "v"}}, "invalid UTF-8"},
		{"unsupported type", obj{"spec": obj{"c": make(chan int)}}, "spec.c: unsupported type chan int"},
		{"unsupported map key", obj{"spec": map[int]string{1: "a"}}, "spec: unsupported map key type int"},
		{"invalid json.Number", obj{"n": json.Number("x")}, `n: invalid number "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Encode(&unstructured.Unstructured{Object: tt.in})
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := Encode(nil)
	require.Error(t, err)
	_, err = Manifest(nil)
	require.Error(t, err)
}

func TestEncodeEmptyObject(t *testing.T) {
	require.Equal(t, "{}\n", encode(t, obj{}))
}
