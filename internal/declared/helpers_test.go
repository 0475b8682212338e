package declared

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"
)

// fixture is one live object from testdata/<name>.json.
type fixture struct {
	name string
	obj  *unstructured.Unstructured
}

// fixtures loads every testdata/*.json the way a dynamic client decodes an API response.
func fixtures(t testing.TB) []fixture {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	var out []fixture
	for _, p := range paths {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		u := &unstructured.Unstructured{}
		require.NoError(t, u.UnmarshalJSON(data), p)
		out = append(out, fixture{name: strings.TrimSuffix(filepath.Base(p), ".json"), obj: u})
	}
	return out
}

func loadFixture(t testing.TB, name string) *unstructured.Unstructured {
	t.Helper()
	for _, f := range fixtures(t) {
		if f.name == name {
			return f.obj
		}
	}
	t.Fatalf("no fixture %q", name)
	return nil
}

// decodeSigs reads YAML the way Kubernetes tooling does: sigs.k8s.io/yaml.Unmarshal into a map,
// with numbers kept as json.Number and then typed the way an unstructured JSON decode types them
// (int64 for an integer literal, float64 otherwise).
func decodeSigs(data []byte) (map[string]interface{}, error) {
	var m map[string]interface{}
	useNumber := func(d *json.Decoder) *json.Decoder { d.UseNumber(); return d }
	if err := sigsyaml.Unmarshal(data, &m, useNumber); err != nil {
		return nil, err
	}
	v, err := typeNumbers(m)
	if err != nil {
		return nil, err
	}
	return v.(map[string]interface{}), nil
}

// mapLeaves replaces every leaf of a decoded YAML or JSON tree (maps and lists are walked, in
// place) by leaf(value).
func mapLeaves(v interface{}, leaf func(interface{}) (interface{}, error)) (interface{}, error) {
	switch v := v.(type) {
	case map[string]interface{}:
		for k, e := range v {
			n, err := mapLeaves(e, leaf)
			if err != nil {
				return nil, err
			}
			v[k] = n
		}
		return v, nil
	case []interface{}:
		for i, e := range v {
			n, err := mapLeaves(e, leaf)
			if err != nil {
				return nil, err
			}
			v[i] = n
		}
		return v, nil
	}
	return leaf(v)
}

// typeNumbers types json.Number leaves: int64 for an integer literal, float64 otherwise.
func typeNumbers(v interface{}) (interface{}, error) {
	return mapLeaves(v, func(v interface{}) (interface{}, error) {
		n, ok := v.(json.Number)
		if !ok {
			return v, nil
		}
		s := string(n)
		if !strings.Contains(s, ".") {
			if i, err := strconv.ParseInt(s, 10, 64); err == nil {
				return i, nil
			}
		}
		return strconv.ParseFloat(s, 64)
	})
}

// viaJSON is what obj becomes through JSON, where 1.0 and 1 are the same number: the exact
// expectation for the sigs.k8s.io/yaml path, which converts YAML to JSON.
func viaJSON(t testing.TB, obj map[string]interface{}) map[string]interface{} {
	t.Helper()
	data, err := json.Marshal(obj)
	require.NoError(t, err)
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.UseNumber()
	var m map[string]interface{}
	require.NoError(t, d.Decode(&m))
	v, err := typeNumbers(m)
	require.NoError(t, err)
	return v.(map[string]interface{})
}

// decodeV3 reads YAML with go.yaml.in/yaml/v3, which keeps an int and a float apart, and types
// ints as int64 like an unstructured object does.
func decodeV3(data []byte) (map[string]interface{}, error) {
	var v interface{}
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	v, err := typeInts(v)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("top level is %T, not a map", v)
	}
	return m, nil
}

// typeInts types int leaves as int64, like an unstructured object, and refuses leaf types an
// unstructured object cannot hold.
func typeInts(v interface{}) (interface{}, error) {
	return mapLeaves(v, func(v interface{}) (interface{}, error) {
		switch v := v.(type) {
		case int:
			return int64(v), nil
		case string, bool, nil, int64, float64:
			return v, nil
		}
		return nil, fmt.Errorf("unexpected %T %v", v, v)
	})
}
