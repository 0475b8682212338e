// Left out of make fuzz's build (tag kubescribe_fuzz): a fuzz build instruments every package
// of the test binary, and this file's imports (Redis and attribution, or the apiserver's audit
// policy evaluator with client-go) would more than double what FuzzDecode compiles.

//go:build !kubescribe_fuzz

package audit_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	apiaudit "k8s.io/apiserver/pkg/audit"
	auditpolicy "k8s.io/apiserver/pkg/audit/policy"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// writeVerbs are every verb that can change something, as the apiserver names them for the
// policy (server-side apply is patch).
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// allVerbs adds the reads.
var allVerbs = append([]string{"get", "list", "watch"}, writeVerbs...)

// evaluator loads the printed policy the way the apiserver loads --audit-policy-file and
// returns its rule evaluator.
func evaluator(t *testing.T) apiaudit.PolicyRuleEvaluator {
	t.Helper()
	p, err := auditpolicy.LoadPolicyFromBytes(audit.Policy())
	require.NoError(t, err)
	return auditpolicy.NewPolicyRuleEvaluator(p)
}

func levelOf(e apiaudit.PolicyRuleEvaluator, verb, group, resource, subresource, namespace string) auditinternal.Level {
	return e.EvaluatePolicyRule(authorizer.AttributesRecord{
		User:            &user.DefaultInfo{Name: "system:node:node-1", Groups: []string{"system:nodes", "system:authenticated"}},
		Verb:            verb,
		Namespace:       namespace,
		APIGroup:        group,
		APIVersion:      "v1",
		Resource:        resource,
		Subresource:     subresource,
		Name:            "x",
		ResourceRequest: true,
	}).Level
}

// TestPolicyLogsNoCredential: every request or response that carries a credential, a command
// line or a proxied body is recorded at most at Metadata level (no body), for every verb.
func TestPolicyLogsNoCredential(t *testing.T) {
	e := evaluator(t)
	for _, tc := range []struct {
		group, resource, subresource, why string
	}{
		{"", "serviceaccounts", "token", "TokenRequest answers with status.token"},
		{"authentication.k8s.io", "tokenreviews", "", "TokenReview carries spec.token"},
		{"authentication.k8s.io", "selfsubjectreviews", "", "who the caller is"},
		{"authorization.k8s.io", "subjectaccessreviews", "", "access reviews change nothing"},
		{"", "secrets", "", "Secret data, bootstrap tokens, legacy service-account tokens"},
		{"", "pods", "exec", "the command line"},
		{"", "pods", "attach", "a stream"},
		{"", "pods", "portforward", "a stream"},
		{"", "pods", "proxy", "a proxied request"},
		{"", "services", "proxy", "a proxied request"},
		{"", "nodes", "proxy", "a proxied request"},
	} {
		for _, verb := range allVerbs {
			for _, ns := range []string{"", "kube-system"} {
				name := fmt.Sprintf("%s %s/%s.%s in %q", verb, tc.resource, tc.subresource, tc.group, ns)
				l := levelOf(e, verb, tc.group, tc.resource, tc.subresource, ns)
				require.True(t, l == auditinternal.LevelNone || l == auditinternal.LevelMetadata,
					"%s (%s): level %s", name, tc.why, l)
			}
		}
	}
}

// TestPolicyKeepsWhatKubescribeNeeds: the writes kubescribe attributes keep the response that
// carries the object's uid and resourceVersion.
func TestPolicyKeepsWhatKubescribeNeeds(t *testing.T) {
	e := evaluator(t)
	for _, tc := range []struct{ group, resource, subresource, namespace string }{
		{"", "configmaps", "", "demo"},
		{"apps", "deployments", "", "demo"},
		{"apps", "deployments", "scale", "demo"},
		{"", "replicationcontrollers", "scale", "demo"},
		{"", "serviceaccounts", "", "demo"},
		{"example.com", "widgets", "", "demo"},
		{"rbac.authorization.k8s.io", "clusterroles", "", ""},
		{"certificates.k8s.io", "certificatesigningrequests", "", ""},
	} {
		for _, verb := range writeVerbs {
			require.Equal(t, auditinternal.LevelRequestResponse, levelOf(e, verb, tc.group, tc.resource, tc.subresource, tc.namespace),
				"%s %s/%s.%s", verb, tc.resource, tc.subresource, tc.group)
		}
	}
	require.Equal(t, auditinternal.LevelNone, levelOf(e, "get", "", "configmaps", "", "demo"), "reads are not recorded")
	require.Equal(t, auditinternal.LevelNone, levelOf(e, "create", "", "events", "", "demo"))
}

// TestPolicyIgnoresNonResourceRequests: a write to a non-resource URL changes no object.
func TestPolicyIgnoresNonResourceRequests(t *testing.T) {
	e := evaluator(t)
	for _, verb := range []string{"post", "put", "patch", "delete", "get"} {
		require.Equal(t, auditinternal.LevelNone, e.EvaluatePolicyRule(authorizer.AttributesRecord{
			User: &user.DefaultInfo{Name: "alice"}, Verb: verb, Path: "/logs/x",
		}).Level, verb)
	}
}
