package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// promRefs is what a PromQL expression refers to: the metrics it selects, with the labels of
// their matchers, and the labels its aggregations and vector matches group by. Reading these
// takes a scanner, not Prometheus' parser (a large dependency for a test): it knows
// identifiers, strings, braces, brackets and parentheses, which is enough to tell a metric
// from a function, a keyword or a label.
type promRefs struct {
	metrics  []promSelector
	grouping []string
}

type promSelector struct {
	name   string
	labels []string
}

// The labels Prometheus attaches to every series of a target scraped through a ServiceMonitor,
// and the one a histogram's buckets carry.
var targetLabels = []string{"namespace", "pod", "job", "instance", "service", "endpoint", "container"}

// promKeywords are identifiers that are not metrics and may stand without a '(' after them:
// keywords, and the aggregation operators (`sum by (code) (...)`).
var promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"}

// promGrouping are the keywords followed by a list of labels.
var promGrouping = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}

func parsePromQL(expr string) (*promRefs, error) {
	refs := &promRefs{}
	s := expr
	depth := map[byte]int{}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end := closingQuote(s, i)
			if end < 0 {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			i = end + 1
		case c == '[':
			end := strings.IndexByte(s[i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("unterminated range at %d", i)
			}
			i += end + 1
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name at %d", i)
		case c == '(' || c == ')':
			if c == '(' {
				depth['(']++
			} else if depth['(']--; depth['('] < 0 {
				return nil, fmt.Errorf("unbalanced ')' at %d", i)
			}
			i++
		case isIdentStart(c):
			j := i + 1
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && s[k] == ' ' {
				k++
			}
			next := byte(0)
			if k < len(s) {
				next = s[k]
			}
			switch {
			case slices.Contains(promGrouping, word) && next == '(':
				end := strings.IndexByte(s[k:], ')')
				if end < 0 {
					return nil, fmt.Errorf("unterminated %s(...) at %d", word, i)
				}
				for _, l := range strings.Split(s[k+1:k+end], ",") {
					if l = strings.TrimSpace(l); l != "" {
						refs.grouping = append(refs.grouping, l)
					}
				}
				i = k + end + 1
			case next == '(' || slices.Contains(promKeywords, word):
				i = j // a function, or a keyword
			case i > 0 && (s[i-1] == '$' || isDigit(s[i-1])):
				i = j // a Grafana variable, or a number's exponent or unit
			default:
				sel := promSelector{name: word}
				i = j
				if next == '{' {
					end, labels, err := readMatchers(s, k)
					if err != nil {
						return nil, err
					}
					sel.labels, i = labels, end+1
				}
				refs.metrics = append(refs.metrics, sel)
			}
		default:
			i++
		}
	}
	if depth['('] != 0 {
		return nil, fmt.Errorf("unbalanced '('")
	}
	return refs, nil
}

// readMatchers reads the label matchers of the selector whose '{' is at s[open], and returns
// the index of its '}' and the labels matched.
func readMatchers(s string, open int) (int, []string, error) {
	var labels []string
	for i := open + 1; i < len(s); {
		switch c := s[i]; {
		case c == '}':
			return i, labels, nil
		case c == '"' || c == '\'' || c == '`':
			end := closingQuote(s, i)
			if end < 0 {
				return 0, nil, fmt.Errorf("unterminated string at %d", i)
			}
			i = end + 1
		case isIdentStart(c):
			j := i + 1
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			labels = append(labels, s[i:j])
			i = j
		default:
			i++
		}
	}
	return 0, nil, fmt.Errorf("unterminated selector at %d", open)
}

func closingQuote(s string, open int) int {
	q := s[open]
	for i := open + 1; i < len(s); i++ {
		switch {
		case s[i] == '\\' && q != '`':
			i++
		case s[i] == q:
			return i
		}
	}
	return -1
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// histogramBase is the histogram a _bucket, _sum or _count series belongs to, when it is one
// of registered; else name.
func histogramBase(name string, registered map[string][]string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if _, known := registered[base]; known {
				return base
			}
		}
	}
	return name
}

// check returns what the expression refers to that registered (metric name: its labels)
// lacks: a metric, a label of a matcher, or a grouping label no selected metric has.
func (r *promRefs) check(registered map[string][]string) []string {
	var problems []string
	available := slices.Clone(targetLabels)
	for _, m := range r.metrics {
		base := histogramBase(m.name, registered)
		labels, ok := registered[base]
		if !ok {
			problems = append(problems, fmt.Sprintf("metric %s is not registered", m.name))
			continue
		}
		own := append(slices.Clone(labels), targetLabels...)
		if base != m.name && strings.HasSuffix(m.name, "_bucket") {
			own = append(own, "le")
		}
		for _, l := range m.labels {
			if l != "__name__" && !slices.Contains(own, l) {
				problems = append(problems, fmt.Sprintf("metric %s has no label %s (it has %v)", base, l, labels))
			}
		}
		available = append(available, own...)
	}
	for _, l := range r.grouping {
		if !slices.Contains(available, l) {
			problems = append(problems, fmt.Sprintf("no metric of the expression has the label %s it groups by", l))
		}
	}
	return problems
}

// TestParsePromQL: the scanner on the forms the dashboard and the alerts use.
func TestParsePromQL(t *testing.T) {
	refs, err := parsePromQL(`histogram_quantile(0.99, sum by (le, route) (rate(a_seconds_bucket{namespace="$namespace", pod=~"$pod"}[$__rate_interval])))`)
	require.NoError(t, err)
	require.Equal(t, []promSelector{{"a_seconds_bucket", []string{"namespace", "pod"}}}, refs.metrics)
	require.Equal(t, []string{"le", "route"}, refs.grouping)

	refs, err = parsePromQL("sum by (namespace) (increase(x_total{type=~\"update|delete\"}[30m])) > 0\nunless on (namespace) sum(y) > 1e3")
	require.NoError(t, err)
	require.Equal(t, []promSelector{{"x_total", []string{"type"}}, {"y", nil}}, refs.metrics)
	require.Equal(t, []string{"namespace", "namespace"}, refs.grouping)

	registered := map[string][]string{"a_seconds": {"route"}, "x_total": {"type"}, "y": nil}
	refs, err = parsePromQL(`sum by (route, code) (rate(a_seconds_count{rout="x"}[5m])) / z`)
	require.NoError(t, err)
	require.Equal(t, []string{
		"metric a_seconds has no label rout (it has [route])",
		"metric z is not registered",
		"no metric of the expression has the label code it groups by",
	}, refs.check(registered))

	for _, bad := range []string{`sum(x`, `x{a="b"`, `{a="b"}`, `x{a="b}`} {
		_, err := parsePromQL(bad)
		require.Error(t, err, bad)
	}
}
