package cluster

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplitRule(t *testing.T) {
	for in, want := range map[string][]string{
		`FORWARD -j KUBESCRIBE-NODE-FWD`: {"FORWARD", "-j", "KUBESCRIBE-NODE-FWD"},
		`KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y`: {
			"KUBE-SERVICES", "-d", "10.96.0.1/32", "-p", "tcp", "-m", "comment", "--comment", "default/kubernetes:https cluster IP",
			"-m", "tcp", "--dport", "443", "-j", "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		`X -m comment --comment "a \"b\"" -j Y`: {"X", "-m", "comment", "--comment", `a "b"`, "-j", "Y"},
	} {
		if got := splitRule(in); !reflect.DeepEqual(got, want) {
			t.Errorf("splitRule(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTableHasRules(t *testing.T) {
	empty := "table ip filter {\n\tchain FORWARD {\n\t\ttype filter hook forward priority filter; policy accept;\n\t}\n}\n"
	if tableHasRules(empty) {
		t.Error("an empty table has rules")
	}
	full := strings.Replace(empty, "policy accept;\n", "policy accept;\n\t\tcounter jump KUBE-FORWARD\n", 1)
	if !tableHasRules(full) {
		t.Error("a rule was not seen")
	}
}
