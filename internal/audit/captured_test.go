package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fixtures in testdata/*.json are real events captured from kube-apiserver v1.37.2 (see
// testdata/README.md). UIDs and resourceVersions change with every recapture, so expectations
// name where a value must come from in the raw event, and the joins between events are
// asserted as relations.

// src names where a fact's value must come from in the raw event.
type src string

const (
	fromNone         src = "none"                              // must be empty
	fromRespMeta     src = "responseObject.metadata"           // responseObject.metadata.<field>
	fromRespDetails  src = "responseObject.details"            // responseObject.details.<field>
	fromGenerateName src = "responseObject.metadata.generated" // name: generated from a prefix
)

type capturedWant struct {
	verb, user, group, resource, subresource, namespace string
	name                                                string // literal, or the generateName prefix with fromGenerateName
	nameFrom                                            src    // "" = literal
	uid, rv                                             src
	terminating                                         bool
}

// capturedEvents returns the raw events of a capture keyed by auditID.
func capturedEvents(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	var list struct {
		Items []map[string]any `json:"items"`
	}
	require.NoError(t, json.Unmarshal(fixture(t, path), &list))
	byID := map[string]map[string]any{}
	for _, ev := range list.Items {
		byID[ev["auditID"].(string)] = ev
	}
	return byID
}

// field reads a string at a dotted path of a raw event; "" when absent.
func field(ev map[string]any, path string) string {
	var cur any = ev
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[k]
	}
	s, _ := cur.(string)
	return s
}

func resolve(t *testing.T, ev map[string]any, from src, fieldName string) string {
	t.Helper()
	switch from {
	case fromNone:
		return ""
	case fromRespMeta, fromRespDetails:
		v := field(ev, string(from)+"."+fieldName)
		require.NotEmpty(t, v, "%s.%s is empty in the capture", from, fieldName)
		return v
	}
	t.Fatalf("unknown source %q", from)
	return ""
}

func TestDecodeCaptured(t *testing.T) {
	cm := func(verb, user, name string) capturedWant {
		return capturedWant{verb: verb, user: user, resource: "configmaps", namespace: "capture", name: name, uid: fromRespMeta, rv: fromRespMeta}
	}
	tests := []struct {
		file        string
		want        []capturedWant // in event order
		wantDropped map[DropReason]int
	}{
		{file: "setup.json", want: []capturedWant{
			{verb: "create", user: "admin", resource: "namespaces", name: "capture", uid: fromRespMeta, rv: fromRespMeta},
			{verb: "create", user: "admin", group: "rbac.authorization.k8s.io", resource: "roles", namespace: "capture", name: "editor", uid: fromRespMeta, rv: fromRespMeta},
			{verb: "create", user: "admin", group: "rbac.authorization.k8s.io", resource: "rolebindings", namespace: "capture", name: "alice-editor", uid: fromRespMeta, rv: fromRespMeta},
		}},
		{file: "create.json", want: []capturedWant{cm("create", "alice", "demo")}},
		{file: "create-generatename.json", want: []capturedWant{
			{verb: "create", user: "alice", resource: "configmaps", namespace: "capture", name: "demo-", nameFrom: fromGenerateName, uid: fromRespMeta, rv: fromRespMeta},
		}},
		{file: "update.json", want: []capturedWant{cm("update", "alice", "demo")}},
		{file: "patch.json", want: []capturedWant{cm("patch", "alice", "demo")}},
		{file: "patch-noop.json", want: []capturedWant{cm("patch", "alice", "demo")}},
		{file: "apply.json", want: []capturedWant{cm("patch", "alice", "applied")}},
		{file: "apply-noop.json", want: []capturedWant{cm("patch", "alice", "applied")}},
		{file: "delete.json", want: []capturedWant{
			{verb: "delete", user: "alice", resource: "configmaps", namespace: "capture", name: "demo", uid: fromRespDetails, rv: fromNone},
		}},
		{file: "delete-finalizer.json", want: []capturedWant{
			cm("create", "alice", "held"),
			{verb: "delete", user: "alice", resource: "configmaps", namespace: "capture", name: "held", uid: fromRespMeta, rv: fromRespMeta, terminating: true},
			{verb: "patch", user: "admin", resource: "configmaps", namespace: "capture", name: "held", uid: fromRespMeta, rv: fromRespMeta, terminating: true},
		}},
		{file: "deletecollection.json", want: []capturedWant{
			cm("create", "alice", "batch-1"),
			cm("create", "alice", "batch-2"),
			{verb: "deletecollection", user: "alice", resource: "configmaps", namespace: "capture", uid: fromNone, rv: fromNone},
		}},
		{file: "dryrun.json", wantDropped: map[DropReason]int{DropDryRun: 1}},
		{file: "forbidden.json", wantDropped: map[DropReason]int{DropFailed: 1}},
		{file: "impersonated.json", want: []capturedWant{cm("create", "alice", "impersonated")}},
		{file: "scale.json", want: []capturedWant{
			{verb: "create", user: "alice", group: "apps", resource: "deployments", namespace: "capture", name: "web", uid: fromRespMeta, rv: fromRespMeta},
			{verb: "update", user: "alice", group: "apps", resource: "deployments", subresource: "scale", namespace: "capture", name: "web", uid: fromRespMeta, rv: fromRespMeta},
			{verb: "patch", user: "alice", group: "apps", resource: "deployments", subresource: "scale", namespace: "capture", name: "web", uid: fromRespMeta, rv: fromRespMeta},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			facts, stats := decodeFile(t, path)
			events := capturedEvents(t, path)
			require.Len(t, facts, len(tt.want))
			for i, w := range tt.want {
				f := facts[i]
				ev := events[f.AuditID]
				require.NotNil(t, ev, "fact %d has the auditID of no event", i)
				require.Equal(t, w.verb, f.Verb)
				require.Equal(t, w.user, f.User.Username)
				require.Equal(t, w.group, f.Group)
				require.Equal(t, w.resource, f.Resource)
				require.Equal(t, w.subresource, f.Subresource)
				require.Equal(t, w.namespace, f.Namespace)
				if w.nameFrom == fromGenerateName {
					require.Empty(t, field(ev, "objectRef.name"), "a generateName create has no objectRef.name")
					require.True(t, strings.HasPrefix(f.Name, w.name), f.Name)
					require.Greater(t, len(f.Name), len(w.name))
					require.Equal(t, field(ev, "responseObject.metadata.name"), f.Name)
				} else {
					require.Equal(t, w.name, f.Name)
				}
				require.Equal(t, resolve(t, ev, w.uid, "uid"), f.UID, "uid")
				require.Equal(t, resolve(t, ev, w.rv, "resourceVersion"), f.ResourceVersion, "resourceVersion")
				require.Equal(t, w.terminating, f.Terminating)
				require.Equal(t, field(ev, "stageTimestamp"), f.StageTimestamp.UTC().Format("2006-01-02T15:04:05.000000Z"))
			}
			if tt.wantDropped == nil {
				require.Empty(t, stats.Dropped)
			} else {
				require.Equal(t, tt.wantDropped, stats.Dropped)
			}
		})
	}
}

// TestCapturedJoinFacts asserts, on the real events, the facts the join in
// internal/attribution is built on (DESIGN.md, "The join").
func TestCapturedJoinFacts(t *testing.T) {
	one := func(t *testing.T, file string, i int) Fact {
		t.Helper()
		facts, _ := decodeFile(t, filepath.Join("testdata", file))
		require.Greater(t, len(facts), i)
		return facts[i]
	}

	t.Run("a create takes its uid from the response", func(t *testing.T) {
		ev := capturedEvents(t, "testdata/create.json")
		for _, e := range ev {
			require.Empty(t, field(e, "objectRef.uid"))
			require.Empty(t, field(e, "objectRef.resourceVersion"))
		}
		require.NotEmpty(t, one(t, "create.json", 0).UID)
	})
	t.Run("the resourceVersion is the post-write one, never the request's", func(t *testing.T) {
		f := one(t, "update.json", 0)
		for _, e := range capturedEvents(t, "testdata/update.json") {
			require.NotEmpty(t, field(e, "objectRef.resourceVersion"))
			require.NotEqual(t, field(e, "objectRef.resourceVersion"), f.ResourceVersion)
		}
	})
	t.Run("an immediate delete names the created uid and no resourceVersion", func(t *testing.T) {
		created, deleted := one(t, "create.json", 0), one(t, "delete.json", 0)
		require.Equal(t, created.UID, deleted.UID)
		require.Empty(t, deleted.ResourceVersion)
	})
	t.Run("no-op patch and apply answer the unchanged resourceVersion", func(t *testing.T) {
		require.Equal(t, one(t, "patch.json", 0).ResourceVersion, one(t, "patch-noop.json", 0).ResourceVersion)
		require.Equal(t, one(t, "apply.json", 0).ResourceVersion, one(t, "apply-noop.json", 0).ResourceVersion)
		require.Equal(t, one(t, "patch.json", 0).UID, one(t, "patch-noop.json", 0).UID)
	})
	t.Run("the finalizer-removing patch carries the held delete's resourceVersion", func(t *testing.T) {
		facts, _ := decodeFile(t, "testdata/delete-finalizer.json")
		require.Len(t, facts, 3)
		created, del, finalize := facts[0], facts[1], facts[2]
		require.Equal(t, created.UID, del.UID)
		require.Equal(t, del.UID, finalize.UID)
		require.NotEqual(t, created.ResourceVersion, del.ResourceVersion, "setting deletionTimestamp is a write")
		require.Equal(t, del.ResourceVersion, finalize.ResourceVersion)
		require.NotEqual(t, del.User.Username, finalize.User.Username)
		require.True(t, del.Terminating)
		require.True(t, finalize.Terminating)
	})
	t.Run("deletecollection keeps its selector and the uids it removed", func(t *testing.T) {
		facts, _ := decodeFile(t, "testdata/deletecollection.json")
		require.Len(t, facts, 3)
		dc := facts[2]
		require.Equal(t, "capture=deletecollection", dc.LabelSelector)
		require.ElementsMatch(t, []string{facts[0].UID, facts[1].UID}, dc.DeletedUIDs)
		require.Empty(t, dc.UID)
		require.Empty(t, dc.Name)
		require.Empty(t, dc.ResourceVersion, "the List's resourceVersion is not a deletion's")
	})
	t.Run("impersonation credits the impersonated user", func(t *testing.T) {
		f := one(t, "impersonated.json", 0)
		require.Equal(t, Identity{Username: "alice", Groups: []string{"system:authenticated"}}, f.User)
		for _, e := range capturedEvents(t, "testdata/impersonated.json") {
			require.Equal(t, "admin", field(e, "user.username"))
		}
	})
	t.Run("scale writes name the Deployment's uid", func(t *testing.T) {
		facts, _ := decodeFile(t, "testdata/scale.json")
		require.Len(t, facts, 3)
		require.Equal(t, facts[0].UID, facts[1].UID)
		require.Equal(t, facts[0].UID, facts[2].UID)
		require.NotEqual(t, facts[1].ResourceVersion, facts[2].ResourceVersion)
	})
}

// TestDecodeCapturedVariants mutates real events into cases the capture does not hold.
func TestDecodeCapturedVariants(t *testing.T) {
	mutate := func(t *testing.T, file string, fn func(ev map[string]any)) []byte {
		t.Helper()
		var list map[string]any
		require.NoError(t, json.Unmarshal(fixture(t, filepath.Join("testdata", file)), &list))
		for _, ev := range list["items"].([]any) {
			fn(ev.(map[string]any))
		}
		b, err := json.Marshal(list)
		require.NoError(t, err)
		return b
	}
	decode := func(t *testing.T, body []byte) ([]Fact, DecodeStats) {
		t.Helper()
		facts, stats, err := Decode(strings.NewReader(string(body)), "local")
		require.NoError(t, err)
		return facts, stats
	}

	t.Run("an update answered with the resourceVersion it sent is a no-op", func(t *testing.T) {
		body := mutate(t, "update.json", func(ev map[string]any) {
			ev["responseObject"].(map[string]any)["metadata"].(map[string]any)["resourceVersion"] = field(ev, "objectRef.resourceVersion")
		})
		facts, stats := decode(t, body)
		require.Empty(t, facts)
		require.Equal(t, map[DropReason]int{DropNoop: 1}, stats.Dropped)
	})
	t.Run("a conflicting update is dropped", func(t *testing.T) {
		body := mutate(t, "update.json", func(ev map[string]any) {
			ev["responseStatus"] = map[string]any{"metadata": map[string]any{}, "status": "Failure", "reason": "Conflict", "code": 409}
		})
		_, stats := decode(t, body)
		require.Equal(t, map[DropReason]int{DropFailed: 1}, stats.Dropped)
	})
	t.Run("an escaped set-based selector is decoded", func(t *testing.T) {
		body := mutate(t, "deletecollection.json", func(ev map[string]any) {
			if ev["verb"] == "deletecollection" {
				ev["requestURI"] = "/api/v1/namespaces/capture/configmaps?labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29&limit=500"
			}
		})
		facts, _ := decode(t, body)
		require.Equal(t, "app=web,tier in (a,b)", facts[2].LabelSelector)
	})
	t.Run("a Metadata-level delete still names the uid from responseStatus", func(t *testing.T) {
		body := mutate(t, "delete.json", func(ev map[string]any) {
			ev["level"] = "Metadata"
			delete(ev, "requestObject")
			delete(ev, "responseObject")
		})
		facts, _ := decode(t, body)
		require.Len(t, facts, 1)
		require.Equal(t, onlyFact(t, "create.json").UID, facts[0].UID)
		require.Empty(t, facts[0].ResourceVersion)
	})
	t.Run("the status subresource is dropped", func(t *testing.T) {
		body := mutate(t, "scale.json", func(ev map[string]any) {
			if ref := ev["objectRef"].(map[string]any); ref["subresource"] == "scale" {
				ref["subresource"] = "status"
			}
		})
		facts, stats := decode(t, body)
		require.Len(t, facts, 1)
		require.Equal(t, map[DropReason]int{DropSubresource: 2}, stats.Dropped)
	})
}

func onlyFact(t *testing.T, file string) Fact {
	t.Helper()
	facts, _ := decodeFile(t, filepath.Join("testdata", file))
	require.Len(t, facts, 1)
	return facts[0]
}

func TestCapturedFixturesPresent(t *testing.T) {
	// The capture is the ground truth for the decoder; losing a file must fail loudly.
	for _, f := range []string{"setup", "create", "create-generatename", "update", "patch", "patch-noop", "apply", "apply-noop",
		"delete", "delete-finalizer", "deletecollection", "dryrun", "forbidden", "impersonated", "scale"} {
		_, err := os.Stat(filepath.Join("testdata", f+".json"))
		require.NoError(t, err)
	}
}
