package declared

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// topLevelOrder is the fixed order of the first top-level keys; the rest follow sorted.
var topLevelOrder = []string{"apiVersion", "kind", "metadata"}

// Manifest is Encode(Form(obj)): the declared form of a live object as stable YAML.
func Manifest(obj *unstructured.Unstructured) ([]byte, error) {
	return Encode(Form(obj))
}

// Encode renders a declared-form object as stable YAML: block style with a 2-space indent, the
// top-level keys apiVersion, kind, metadata first (metadata's keys name, namespace, labels,
// annotations first), every other map's keys sorted, lists in their order, multi-line strings as
// literal block scalars, strings that would read back as another type quoted, int64 and float64
// kept apart (a float always has a '.' or an exponent), and a trailing newline. Encoding the same
// object twice gives the same bytes. It encodes whatever obj holds; it does not apply Form.
//
// Values must be what unstructured content is made of (maps with string keys, slices, strings,
// bools, nil, int64, float64, json.Number; other Go integer and float types are accepted too).
// Invalid UTF-8, NaN and infinities have no JSON form, so no Kubernetes object holds them: they are
// errors, as is any other type.
func Encode(obj *unstructured.Unstructured) ([]byte, error) {
	if obj == nil {
		return nil, errors.New("declared: encode a nil object")
	}
	root, err := mappingNode(obj.Object, topLevelOrder, true)
	if err != nil {
		return nil, fmt.Errorf("declared: encode: %w", err)
	}
	var buf bytes.Buffer
	buf.Grow(1024)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("declared: encode: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("declared: encode: %w", err)
	}
	return buf.Bytes(), nil
}

// pathError says where in the object an unencodable value is.
type pathError struct {
	path []string
	err  error
}

func (e *pathError) Error() string { return strings.Join(e.path, ".") + ": " + e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

// at prefixes err's path with one more segment.
func at(segment string, err error) error {
	var pe *pathError
	if errors.As(err, &pe) {
		pe.path = append([]string{segment}, pe.path...)
		return pe
	}
	return &pathError{path: []string{segment}, err: err}
}

// valueNode builds the node of one value.
func valueNode(v interface{}) (*yaml.Node, error) {
	switch v := v.(type) {
	case nil:
		return nullNode(), nil
	case string:
		return stringNode(v, false)
	case bool:
		return boolNode(v), nil
	case int64:
		return intNode(strconv.FormatInt(v, 10)), nil
	case float64:
		return floatNode(v, 64)
	case map[string]interface{}:
		if v == nil {
			return nullNode(), nil
		}
		return mappingNode(v, nil, false)
	case []interface{}:
		if v == nil {
			return nullNode(), nil
		}
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: make([]*yaml.Node, len(v))}
		for i, e := range v {
			c, err := valueNode(e)
			if err != nil {
				return nil, at("["+strconv.Itoa(i)+"]", err)
			}
			n.Content[i] = c
		}
		return n, nil
	case json.Number:
		return numberNode(v)
	}
	return reflectNode(reflect.ValueOf(v))
}

// reflectNode covers values built by hand rather than decoded from JSON: other integer and float
// types, named string types, and maps and slices of other element types.
func reflectNode(rv reflect.Value) (*yaml.Node, error) {
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return intNode(strconv.FormatInt(rv.Int(), 10)), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return intNode(strconv.FormatUint(rv.Uint(), 10)), nil
	case reflect.Float32:
		return floatNode(rv.Float(), 32)
	case reflect.Float64:
		return floatNode(rv.Float(), 64)
	case reflect.String:
		return stringNode(rv.String(), false)
	case reflect.Bool:
		return boolNode(rv.Bool()), nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("unsupported map key type %s", rv.Type().Key())
		}
		if rv.IsNil() {
			return nullNode(), nil
		}
		m := make(map[string]interface{}, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			m[it.Key().String()] = it.Value().Interface()
		}
		return mappingNode(m, nil, false)
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nullNode(), nil
		}
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: make([]*yaml.Node, rv.Len())}
		for i := range rv.Len() {
			c, err := valueNode(rv.Index(i).Interface())
			if err != nil {
				return nil, at("["+strconv.Itoa(i)+"]", err)
			}
			n.Content[i] = c
		}
		return n, nil
	case reflect.Interface, reflect.Pointer:
		if rv.IsNil() {
			return nullNode(), nil
		}
	}
	return nil, fmt.Errorf("unsupported type %s", rv.Type())
}

// mappingNode builds a block mapping. Keys listed in first come first, in that order; the rest
// follow sorted. The top-level metadata map gets its own fixed order.
func mappingNode(m map[string]interface{}, first []string, top bool) (*yaml.Node, error) {
	keys := make([]string, 0, len(m))
	rest := make([]string, 0, len(m))
	for _, k := range first {
		if _, ok := m[k]; ok {
			keys = append(keys, k)
		}
	}
	for k := range m {
		if !contains(first, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	keys = append(keys, rest...)

	n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: make([]*yaml.Node, 0, 2*len(keys))}
	for _, k := range keys {
		kn, err := stringNode(k, true)
		if err != nil {
			return nil, at(k, err)
		}
		var vn *yaml.Node
		if md, ok := m[k].(map[string]interface{}); ok && top && k == "metadata" && md != nil {
			vn, err = mappingNode(md, keptMetadata, false)
		} else {
			vn, err = valueNode(m[k])
		}
		if err != nil {
			return nil, at(k, err)
		}
		n.Content = append(n.Content, kn, vn)
	}
	return n, nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func nullNode() *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
}

func boolNode(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func intNode(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: s}
}

// floatNode writes the shortest text that parses back to the same float, and always with a '.' or
// an exponent, so it reads back as a float and not as an int.
func floatNode(f float64, bits int) (*yaml.Node, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%v has no JSON form", f)
	}
	s := strconv.FormatFloat(f, 'g', -1, bits)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: s}, nil
}

// numberNode writes a json.Number as an int when it is one, else as a float.
func numberNode(n json.Number) (*yaml.Node, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return intNode(strconv.FormatInt(i, 10)), nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, fmt.Errorf("invalid number %q", s)
	}
	return floatNode(f, 64)
}

// stringNode builds a string scalar that reads back as that same string, under both YAML 1.2
// (go.yaml.in/yaml/v3) and YAML 1.1 (sigs.k8s.io/yaml, kubectl) rules.
//
//   - Multi-line values are literal block scalars (the emitter itself falls back to a double-quoted
//     scalar where a literal block cannot hold the value, e.g. a line ending in a space). Keys and
//     values with a carriage return or a Unicode line or paragraph separator are double-quoted
//     instead: YAML parsers normalize line breaks inside block scalars. So is a value that starts
//     with a tab: a reader would take that tab for block indentation, which must be spaces.
//   - Values that would resolve to something else plain (true, yes, 1, 0755, 1e3, null, ~,
//     2024-01-01, 12:30, <<, the empty string) are double-quoted.
//   - The !!str tag makes the emitter quote anything else YAML 1.2 would resolve otherwise.
func stringNode(s string, key bool) (*yaml.Node, error) {
	if !utf8.ValidString(s) {
		return nil, errors.New("invalid UTF-8") // the value itself stays out of logs
	}
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	switch {
	case strings.ContainsAny(s, "\r\u0085\u2028\u2029"):
		n.Style = yaml.DoubleQuotedStyle
	case strings.Contains(s, "\n"):
		if key || s[0] == '\t' {
			n.Style = yaml.DoubleQuotedStyle
		} else {
			n.Style = yaml.LiteralStyle
		}
	case readsAsNonString(s):
		n.Style = yaml.DoubleQuotedStyle
	}
	return n, nil
}

// yaml11Words are the plain scalars YAML 1.1 resolves to a bool or null, and the merge key.
var yaml11Words = map[string]bool{
	"": true, "~": true, "null": true, "Null": true, "NULL": true, "<<": true,
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
	"n": true, "N": true, "no": true, "No": true, "NO": true,
	"true": true, "True": true, "TRUE": true, "false": true, "False": true, "FALSE": true,
	"on": true, "On": true, "ON": true, "off": true, "Off": true, "OFF": true,
}

// readsAsNonString reports whether s, written plain, could be read as something other than a
// string (a bool, null, a number, a timestamp, a sexagesimal number, the merge key) by a YAML 1.1
// or 1.2 reader. It errs on the side of quoting: a needless quote costs nothing.
func readsAsNonString(s string) bool {
	if yaml11Words[s] {
		return true
	}
	c := s[0]
	if !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
		return false
	}
	switch strings.ToLower(s) {
	case ".inf", "+.inf", "-.inf", ".nan":
		return true
	}
	plain := strings.ReplaceAll(s, "_", "")
	if _, err := strconv.ParseInt(plain, 0, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		return true
	}
	if _, err := strconv.ParseUint(plain, 0, 64); err == nil {
		return true
	}
	if _, err := strconv.ParseFloat(plain, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		return true
	}
	return timestampLike(s) || sexagesimalLike(s)
}

// timestampLike: every YAML timestamp starts with a four-digit year and a dash.
func timestampLike(s string) bool {
	if len(s) < 5 || s[4] != '-' {
		return false
	}
	for i := range 4 {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// sexagesimalLike: YAML 1.1 base-60 numbers such as 1:30 or -190:20:30.15 (go-yaml does not read
// them as numbers, other YAML 1.1 readers do). Any digit-led run of digits, '_', ':' and '.' that
// has a ':' is quoted.
func sexagesimalLike(s string) bool {
	if s[0] == '+' || s[0] == '-' {
		s = s[1:]
	}
	if s == "" || s[0] < '0' || s[0] > '9' || !strings.Contains(s, ":") {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9', c == '_', c == ':', c == '.':
		default:
			return false
		}
	}
	return true
}
