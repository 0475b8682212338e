package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// grant is one verb a role is granted on one thing: a resource of a group (perhaps one object
// of it), or a non-resource URL.
type grant struct {
	role, verb, group, resource, name, url string
}

func (g grant) String() string {
	if g.url != "" {
		return fmt.Sprintf("%s: %s %s", g.role, g.verb, g.url)
	}
	s := fmt.Sprintf("%s: %s %s", g.role, g.verb, g.resource)
	if g.group != "" {
		s += "." + g.group
	}
	if g.name != "" {
		s += " named " + g.name
	}
	return s
}

// TestRBACDocumented: every rule a ClusterRole or Role of deploy/ grants (every overlay, those
// of docs/install.md, and deploy/source-cluster-rbac.yaml) is explained by a row of docs/security.md's tables headed
// `Role | Grant | Why`, and every such row names a rule that is granted: a new rule cannot
// ship unexplained, nor an explanation outlive its rule.
func TestRBACDocumented(t *testing.T) {
	granted := map[grant][]string{} // where each is granted
	add := func(where string, objs []*rbacRole) {
		for _, o := range objs {
			for _, g := range o.grants() {
				granted[g] = append(granted[g], where)
			}
		}
	}
	installs, err := Installations(root)
	require.NoError(t, err)
	for overlay, kustomization := range installs {
		objs, err := BuildOverlay(root, t.TempDir(), overlay, kustomization)
		require.NoError(t, err)
		var roles []*rbacRole
		for _, o := range objs {
			if o.GetKind() == "ClusterRole" || o.GetKind() == "Role" {
				var r rbacRole
				require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r.ClusterRole))
				roles = append(roles, &r)
			}
		}
		require.NotEmpty(t, roles)
		add("deploy/overlays/"+overlay, roles)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "source-cluster-rbac.yaml"))
	require.NoError(t, err)
	objs, err := Objects(b)
	require.NoError(t, err)
	var remote []*rbacRole
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" {
			var r rbacRole
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r.ClusterRole))
			remote = append(remote, &r)
		}
	}
	require.Len(t, remote, 1)
	add("deploy/source-cluster-rbac.yaml", remote)

	doc, err := os.ReadFile(filepath.Join(root, "docs", "security.md"))
	require.NoError(t, err)
	explained, err := parseGrantTables(string(doc))
	require.NoError(t, err)
	require.NotEmpty(t, explained)

	var unexplained, stale []string
	for g, where := range granted {
		if _, ok := explained[g]; !ok {
			unexplained = append(unexplained, fmt.Sprintf("%s (in %s)", g, strings.Join(slices.Compact(slices.Sorted(slices.Values(where))), ", ")))
		}
	}
	for g, line := range explained {
		if _, ok := granted[g]; !ok {
			stale = append(stale, fmt.Sprintf("%s (docs/security.md:%d)", g, line))
		}
	}
	slices.Sort(unexplained)
	slices.Sort(stale)
	require.Empty(t, unexplained, "granted by deploy/ but explained by no row of docs/security.md#rbac")
	require.Empty(t, stale, "explained in docs/security.md#rbac but granted by no role of deploy/")
}

// rbacRole is a ClusterRole or a Role (their names and rules decode alike).
type rbacRole struct{ rbacv1.ClusterRole }

func (r *rbacRole) grants() []grant {
	var gs []grant
	for _, rule := range r.Rules {
		for _, verb := range rule.Verbs {
			for _, url := range rule.NonResourceURLs {
				gs = append(gs, grant{role: r.Name, verb: verb, url: url})
			}
			for _, group := range rule.APIGroups {
				for _, resource := range rule.Resources {
					names := rule.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}
					for _, name := range names {
						gs = append(gs, grant{role: r.Name, verb: verb, group: group, resource: resource, name: name})
					}
				}
			}
		}
	}
	return gs
}

var backticked = regexp.MustCompile("`([^`]+)`")

// parseGrantTables reads the rows of the Markdown tables whose header is `| Role | Grant |
// Why |`, and returns each grant they name with its line. A Grant cell is one or more clauses
// separated by ";", each "`verb`, ... on `resource.group`, ... [named `name`, ...]": a
// resource without a dot is of the core group, a subresource is written as RBAC does
// (`gittargets/status.kubescribe.dev`), a non-resource URL is its path. Text outside
// backticks is ignored but for the words "on" and "named".
func parseGrantTables(doc string) (map[grant]int, error) {
	out := map[grant]int{}
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		if !isGrantHeader(lines[i]) {
			continue
		}
		i += 2 // the header and its delimiter row
		for ; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
			cells := splitRow(lines[i])
			if len(cells) != 3 {
				return nil, fmt.Errorf("line %d: want 3 cells, got %d", i+1, len(cells))
			}
			roles := backticked.FindAllStringSubmatch(cells[0], -1)
			if len(roles) != 1 {
				return nil, fmt.Errorf("line %d: the Role cell must name one role in backticks", i+1)
			}
			role := roles[0][1]
			for _, clause := range strings.Split(cells[1], ";") {
				verbsPart, targets, ok := strings.Cut(clause, " on ")
				if !ok {
					return nil, fmt.Errorf("line %d: %q has no \" on \"", i+1, clause)
				}
				resourcesPart, namesPart, _ := strings.Cut(targets, " named ")
				verbs, resources, names := ticks(verbsPart), ticks(resourcesPart), ticks(namesPart)
				if len(verbs) == 0 || len(resources) == 0 {
					return nil, fmt.Errorf("line %d: %q names no verb or no resource", i+1, clause)
				}
				if len(names) == 0 {
					names = []string{""}
				}
				for _, verb := range verbs {
					for _, res := range resources {
						if strings.HasPrefix(res, "/") {
							out[grant{role: role, verb: verb, url: res}] = i + 1
							continue
						}
						resource, group, _ := strings.Cut(res, ".")
						for _, name := range names {
							out[grant{role: role, verb: verb, group: group, resource: resource, name: name}] = i + 1
						}
					}
				}
			}
		}
	}
	return out, nil
}

func isGrantHeader(line string) bool {
	cells := splitRow(line)
	return len(cells) == 3 && cells[0] == "Role" && cells[1] == "Grant" && cells[2] == "Why"
}

// splitRow splits a Markdown table row into its trimmed cells (an escaped \| stays in its cell).
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") {
		return nil
	}
	line = strings.ReplaceAll(line[1:len(line)-1], `\|`, "\x00")
	var cells []string
	for _, c := range strings.Split(line, "|") {
		cells = append(cells, strings.TrimSpace(strings.ReplaceAll(c, "\x00", `\|`)))
	}
	return cells
}

func ticks(s string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestParseGrantTables: the notation, on a table of its own.
func TestParseGrantTables(t *testing.T) {
	got, err := parseGrantTables("text\n\n| Role | Grant | Why |\n| --- | --- | --- |\n" +
		"| `r` | `get`, `list` on `pods`, `deployments/scale.apps`; `get` on `/metrics` | because |\n" +
		"| `s` | `update` on `leases.coordination.k8s.io` named `a`, `b` | `x` \\| `y` |\n\nafter\n| a | b |\n")
	require.NoError(t, err)
	require.Equal(t, map[grant]int{
		{role: "r", verb: "get", resource: "pods"}:                                               5,
		{role: "r", verb: "list", resource: "pods"}:                                              5,
		{role: "r", verb: "get", group: "apps", resource: "deployments/scale"}:                   5,
		{role: "r", verb: "list", group: "apps", resource: "deployments/scale"}:                  5,
		{role: "r", verb: "get", url: "/metrics"}:                                                5,
		{role: "s", verb: "update", group: "coordination.k8s.io", resource: "leases", name: "a"}: 6,
		{role: "s", verb: "update", group: "coordination.k8s.io", resource: "leases", name: "b"}: 6,
	}, got)
	_, err = parseGrantTables("| Role | Grant | Why |\n| --- | --- | --- |\n| `r` | `get` pods | x |\n")
	require.ErrorContains(t, err, `has no " on "`)
}
