package audit

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// factView is the part of a Fact the fixture tables assert.
type factView struct {
	AuditID     string
	Verb        string
	User        string
	Group       string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	UID         string
	RV          string
	Terminating bool
}

func viewOf(f Fact) factView {
	return factView{
		AuditID: f.AuditID, Verb: f.Verb, User: f.User.Username, Group: f.Group, Resource: f.Resource,
		Subresource: f.Subresource, Namespace: f.Namespace, Name: f.Name, UID: f.UID,
		RV: f.ResourceVersion, Terminating: f.Terminating,
	}
}

func decodeFile(t testing.TB, path string) ([]Fact, DecodeStats) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	facts, stats, err := Decode(bytes.NewReader(data), "local")
	require.NoError(t, err)
	require.Equal(t, stats.Events, stats.Kept+sumDropped(stats), "every event is kept or dropped")
	require.Len(t, facts, stats.Kept)
	for _, f := range facts {
		require.Equal(t, "local", f.Route)
	}
	return facts, stats
}

func sumDropped(s DecodeStats) int {
	n := 0
	for _, c := range s.Dropped {
		n += c
	}
	return n
}

// TestDecodeHandmade covers what the real captures (TestDecodeCaptured) do not: reads,
// non-resource requests, Metadata-level events, other stages, and custom resources whose
// top-level fields collide with the names Decode looks for.
func TestDecodeHandmade(t *testing.T) {
	tests := []struct {
		file        string
		want        []factView
		wantDropped map[DropReason]int
	}{
		{
			file: "custom-resource.json",
			want: []factView{{AuditID: "cr-1", Verb: "patch", User: "alice", Group: "example.com", Resource: "widgets", Namespace: "team-a", Name: "w1", UID: "77777777-0000-0000-0000-000000000001", RV: "7001"}},
		},
		{
			file: "noise.json",
			want: []factView{
				// Metadata level (secrets): no response, so no uid for a create and never the
				// request's resourceVersion.
				{AuditID: "secret-1", Verb: "create", User: "alice", Resource: "secrets", Namespace: "team-a", Name: "s1"},
				{AuditID: "secret-2", Verb: "update", User: "alice", Resource: "secrets", Namespace: "team-a", Name: "s1", UID: "66666666-0000-0000-0000-000000000001"},
			},
			wantDropped: map[DropReason]int{DropVerb: 2, DropStage: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			facts, stats := decodeFile(t, filepath.Join("testdata", "handmade", tt.file))
			got := make([]factView, 0, len(facts))
			for _, f := range facts {
				got = append(got, viewOf(f))
			}
			require.Equal(t, tt.want, got)
			if tt.wantDropped == nil {
				require.Empty(t, stats.Dropped)
			} else {
				require.Equal(t, tt.wantDropped, stats.Dropped)
			}
		})
	}
}

func TestDecodeIdentity(t *testing.T) {
	facts, _ := decodeFile(t, "testdata/handmade/noise.json")
	require.NotEmpty(t, facts)
	require.Equal(t, Identity{
		Username: "alice",
		UID:      "u-alice",
		Groups:   []string{"devs", "system:authenticated"},
		Extra:    map[string][]string{"authentication.kubernetes.io/credential-id": {"X509SHA256=ab"}},
	}, facts[0].User)
	require.Equal(t, time.Date(2026, 11, 30, 1, 30, 0, 123456000, time.UTC), facts[0].StageTimestamp.UTC())
}

func TestDecodeFilter(t *testing.T) {
	// One event, mutated per case.
	const base = `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{
		"auditID":"x","stage":"ResponseComplete","verb":"patch","requestURI":"/api/v1/namespaces/ns/configmaps/c%s",
		"user":{"username":"u"},
		"objectRef":{"resource":"configmaps","namespace":"ns","name":"c"%s},
		"responseStatus":%s,
		"responseObject":{"kind":"ConfigMap","metadata":{"uid":"id","resourceVersion":"9"}}}]}`
	tests := []struct {
		name   string
		query  string
		ref    string
		status string
		want   DropReason // "" = kept
	}{
		{name: "kept", status: `{"code":200}`},
		{name: "created", status: `{"code":201}`},
		{name: "conflict", status: `{"code":409}`, want: DropFailed},
		{name: "redirect", status: `{"code":300}`, want: DropFailed},
		{name: "no code", status: `{}`, want: DropFailed},
		{name: "no status", status: `null`, want: DropFailed},
		{name: "dry run All", query: "?dryRun=All", status: `{"code":200}`, want: DropDryRun},
		{name: "dry run any value", query: "?fieldManager=x&dryRun=", status: `{"code":200}`, want: DropDryRun},
		{name: "dry run with a malformed pair", query: "?a=%zz&dryRun=All", status: `{"code":200}`, want: DropDryRun},
		{name: "dryRun in the path is not a query", query: "-dryRun", status: `{"code":200}`},
		{name: "escaped dryRun key", query: "?dry%52un=All", status: `{"code":200}`, want: DropDryRun},
		{name: "dryRun pair with an invalid escape is no pair", query: "?dryRun=%zz", status: `{"code":200}`},
		{name: "dryRun pair with a semicolon is no pair", query: "?x=1;dryRun=All", status: `{"code":200}`},
		{name: "dryRun without a value", query: "?a&dryRun", status: `{"code":200}`, want: DropDryRun},
		{name: "status subresource", ref: `,"subresource":"status"`, status: `{"code":200}`, want: DropSubresource},
		{name: "scale subresource", ref: `,"subresource":"scale"`, status: `{"code":200}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(fmtBase(base, tt.query, tt.ref, tt.status))
			facts, stats, err := Decode(bytes.NewReader(body), "r")
			require.NoError(t, err)
			require.Equal(t, 1, stats.Events)
			if tt.want == "" {
				require.Len(t, facts, 1)
				require.Equal(t, "9", facts[0].ResourceVersion)
				return
			}
			require.Empty(t, facts)
			require.Equal(t, map[DropReason]int{tt.want: 1}, stats.Dropped)
		})
	}
}

// TestQueryHasDryRunAgreesWithParseQuery holds the allocation-free dryRun check to
// url.ParseQuery's reading of a query.
func TestQueryHasDryRunAgreesWithParseQuery(t *testing.T) {
	for _, q := range []string{"", "dryRun", "dryRun=", "dryRun=All", "a=1&dryRun=All", "dryRun=%zz", "dry%52un=1", "dry%52un=%z",
		"dry%5", "x;dryRun=1", "x=1&&dryRun", "dryRun=a;b", "dryrun=All", "DryRun=All", "dry+Run=1", "%64ryRun=", "a=%zz&dryRun=All", "dryRun%=1"} {
		_, want := parseQuery(q)["dryRun"]
		ev := crEvent("q", "patch", "w1", `{}`, `{"kind":"Widget","metadata":{"uid":"u","resourceVersion":"1"}}`)
		ev = strings.Replace(ev, `/widgets/w1"`, `/widgets/w1?`+q+`"`, 1)
		_, stats := decodeBody(t, eventList(ev))
		require.Equal(t, want, stats.Dropped[DropDryRun] == 1, "query %q", q)
	}
}

func parseQuery(q string) url.Values {
	v, _ := url.ParseQuery(q)
	return v
}

func fmtBase(base string, args ...string) string {
	for _, a := range args {
		base = strings.Replace(base, "%s", a, 1)
	}
	return base
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string
	}{
		{name: "empty", body: ``, wantErr: "invalid JSON"},
		{name: "truncated", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"verb":`, wantErr: "invalid JSON"},
		{name: "not an object", body: `[1,2]`, wantErr: "the body is a JSON array, not an object"},
		{name: "a string", body: `"EventList"`, wantErr: "the body is a JSON string, not an object"},
		{name: "trailing garbage", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[]} x`, wantErr: "invalid JSON"},
		{name: "wrong kind", body: `{"kind":"Event","apiVersion":"audit.k8s.io/v1"}`, wantErr: `kind "Event"`},
		{name: "wrong version", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1beta1","items":[]}`, wantErr: `apiVersion "audit.k8s.io/v1beta1"`},
		{name: "no type", body: `{"items":[]}`, wantErr: "unsupported body"},
		{name: "items not a list", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{}}`, wantErr: `field "items": want a JSON array, got a JSON object`},
		{name: "kind not a string", body: `{"kind":7,"apiVersion":"audit.k8s.io/v1","items":[]}`, wantErr: `field "kind": want a JSON string, got a JSON number`},
		{name: "invalid JSON inside an event", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"verb":"create",}]}`, wantErr: "invalid JSON at offset"},
		{name: "upper-case keys are not the list's", body: `{"KIND":"EventList","ApiVersion":"audit.k8s.io/v1","items":[]}`, wantErr: "unsupported body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			facts, _, err := Decode(strings.NewReader(tt.body), "r")
			require.ErrorContains(t, err, tt.wantErr)
			require.Nil(t, facts)
		})
	}
}

func TestDecodeEmptyList(t *testing.T) {
	facts, stats, err := Decode(strings.NewReader(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[]}`), "r")
	require.NoError(t, err)
	require.Empty(t, facts)
	require.Equal(t, DecodeStats{}, stats)
}

// eventList wraps raw events in an audit.k8s.io/v1 EventList.
func eventList(events ...string) []byte {
	return []byte(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[` + strings.Join(events, ",") + `]}`)
}

// crEvent is a RequestResponse event on custom resource widgets.example.com (namespace team-a)
// whose responseObject is given raw.
func crEvent(auditID, verb, name, requestObject, responseObject string) string {
	uri := "/apis/example.com/v1/namespaces/team-a/widgets"
	if verb != "create" {
		uri += "/" + name
	}
	return `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"` + auditID + `",
		"stage":"ResponseComplete","requestURI":"` + uri + `","verb":"` + verb + `",
		"user":{"username":"alice","groups":["system:authenticated"]},
		"objectRef":{"resource":"widgets","namespace":"team-a","name":"` + name + `","apiGroup":"example.com","apiVersion":"v1"},
		"responseStatus":{"metadata":{},"code":200},
		"requestObject":` + requestObject + `,
		"responseObject":` + responseObject + `,
		"requestReceivedTimestamp":"2026-11-30T01:30:00.100000Z","stageTimestamp":"2026-11-30T01:30:00.123456Z"}`
}

// fixtureEvents returns the raw items of a captured fixture, each mutated by fn (when not nil).
func fixtureEvents(t *testing.T, file string, fn func(ev map[string]any)) []string {
	t.Helper()
	var list struct {
		Items []map[string]any `json:"items"`
	}
	require.NoError(t, json.Unmarshal(fixture(t, filepath.Join("testdata", file)), &list))
	out := make([]string, 0, len(list.Items))
	for _, ev := range list.Items {
		if fn != nil {
			fn(ev)
		}
		b, err := json.Marshal(ev)
		require.NoError(t, err)
		out = append(out, string(b))
	}
	return out
}

func decodeBody(t *testing.T, body []byte) ([]Fact, DecodeStats) {
	t.Helper()
	facts, stats, err := Decode(bytes.NewReader(body), "local")
	require.NoError(t, err)
	require.Equal(t, stats.Events, stats.Kept+sumDropped(stats), "every event is kept or dropped")
	require.Len(t, facts, stats.Kept)
	return facts, stats
}

// setDryRun puts dryRun into the DeleteOptions of a delete or deletecollection event, as
// kubectl delete --dry-run=server and client-go's DeleteOptions.DryRun send it: in the body,
// not the URI.
func setDryRun(value any) func(ev map[string]any) {
	return func(ev map[string]any) {
		if v := ev["verb"]; v != "delete" && v != "deletecollection" {
			return
		}
		ev["requestObject"].(map[string]any)["dryRun"] = value
	}
}

func TestDecodeDryRunDeleteBody(t *testing.T) {
	t.Run("a server-side dry-run delete is dropped", func(t *testing.T) {
		events := fixtureEvents(t, "delete.json", setDryRun([]string{"All"}))
		require.Len(t, events, 1)
		require.NotContains(t, field(mustMap(t, events[0]), "requestURI"), "dryRun", "the URI says nothing")
		facts, stats := decodeBody(t, eventList(events...))
		require.Empty(t, facts)
		require.Equal(t, map[DropReason]int{DropDryRun: 1}, stats.Dropped)
	})
	t.Run("a dry run before the real delete does not take its credit", func(t *testing.T) {
		dry := fixtureEvents(t, "delete.json", func(ev map[string]any) {
			setDryRun([]string{"All"})(ev)
			ev["auditID"] = "mallory-dry-run"
			ev["user"] = map[string]any{"username": "mallory", "groups": []string{"system:authenticated"}}
			ev["stageTimestamp"] = "2026-11-30T01:40:55.000000Z" // earlier than alice's
		})
		real := fixtureEvents(t, "delete.json", nil)
		facts, stats := decodeBody(t, eventList(dry[0], real[0]))
		require.Len(t, facts, 1)
		require.Equal(t, "alice", facts[0].User.Username)
		require.Equal(t, "delete", facts[0].Verb)
		require.Equal(t, onlyFact(t, "create.json").UID, facts[0].UID)
		require.Equal(t, map[DropReason]int{DropDryRun: 1}, stats.Dropped)
	})
	t.Run("a server-side dry-run deletecollection is dropped", func(t *testing.T) {
		facts, stats := decodeBody(t, eventList(fixtureEvents(t, "deletecollection.json", setDryRun([]string{"All"}))...))
		require.Len(t, facts, 2)
		for _, f := range facts {
			require.Equal(t, "create", f.Verb)
		}
		require.Equal(t, map[DropReason]int{DropDryRun: 1}, stats.Dropped)
	})
	t.Run("an empty or null dryRun is a real delete", func(t *testing.T) {
		for _, v := range []any{[]string{}, nil} {
			facts, stats := decodeBody(t, eventList(fixtureEvents(t, "delete.json", setDryRun(v))...))
			require.Len(t, facts, 1, "dryRun %v", v)
			require.Empty(t, stats.Dropped)
		}
	})
	t.Run("for a delete the recorded options decide, not the URI", func(t *testing.T) {
		// The apiserver takes a delete's options from its body when there is one and ignores
		// the query; without a body it parses the query into the options it records. Either
		// way the recorded DeleteOptions are the effective ones.
		withURI := func(ev map[string]any) { ev["requestURI"] = field(ev, "requestURI") + "?dryRun=All" }
		facts, stats := decodeBody(t, eventList(fixtureEvents(t, "delete.json", withURI)...))
		require.Len(t, facts, 1, "a real delete with a body must not be dropped for its URI")
		require.Empty(t, stats.Dropped)
		facts, stats = decodeBody(t, eventList(fixtureEvents(t, "delete.json", func(ev map[string]any) {
			withURI(ev)
			setDryRun([]string{"All"})(ev)
		})...))
		require.Empty(t, facts)
		require.Equal(t, map[DropReason]int{DropDryRun: 1}, stats.Dropped)
	})
	t.Run("a dryRun that is not a list of strings is malformed", func(t *testing.T) {
		facts, stats := decodeBody(t, eventList(fixtureEvents(t, "delete.json", setDryRun("All"))...))
		require.Empty(t, facts)
		require.Equal(t, map[DropReason]int{DropMalformed: 1}, stats.Dropped)
	})
	t.Run("other verbs' request bodies are never read", func(t *testing.T) {
		// A custom resource may have a top-level dryRun field of any shape; a create's or a
		// patch's dry-run is only ever a query parameter. A JSON patch body is an array.
		resp := `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"team-a","uid":"w-uid","resourceVersion":"5"}}`
		facts, stats := decodeBody(t, eventList(
			crEvent("c1", "create", "w1", `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1"},"dryRun":["All"]}`, resp),
			crEvent("c2", "patch", "w1", `{"dryRun":"yes"}`, resp),
			crEvent("c3", "patch", "w1", `[{"op":"replace","path":"/dryRun","value":1}]`, resp),
		))
		require.Len(t, facts, 3)
		require.Empty(t, stats.Dropped)
	})
}

func mustMap(t *testing.T, raw string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &m))
	return m
}

func TestDecodeCaseSensitive(t *testing.T) {
	t.Run("a custom resource's Metadata field is not metadata", func(t *testing.T) {
		// Root fields of a custom resource with x-kubernetes-preserve-unknown-fields.
		facts, stats := decodeBody(t, eventList(crEvent("cr-1", "patch", "w1", `{"Metadata":"x"}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"team-a","uid":"w-uid","resourceVersion":"7001"},"Metadata":"x","Kind":7,"ITEMS":{}}`)))
		require.Empty(t, stats.Dropped)
		require.Len(t, facts, 1)
		require.Equal(t, "w-uid", facts[0].UID)
		require.Equal(t, "7001", facts[0].ResourceVersion)
	})
	t.Run("an upper-case METADATA does not override metadata", func(t *testing.T) {
		facts, _ := decodeBody(t, eventList(crEvent("cr-1", "patch", "w1", `{}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"team-a","uid":"w-uid","resourceVersion":"7001"},`+
				`"METADATA":{"uid":"forged-uid","resourceVersion":"1","deletionTimestamp":"2026-01-01T00:00:00Z"},"Metadata":{"uid":"forged-too"}}`)))
		require.Len(t, facts, 1)
		require.Equal(t, "w-uid", facts[0].UID)
		require.Equal(t, "7001", facts[0].ResourceVersion)
		require.False(t, facts[0].Terminating)
	})
	t.Run("event fields match case-sensitively too", func(t *testing.T) {
		ev := strings.Replace(crEvent("cr-1", "patch", "w1", `{}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"uid":"w-uid","resourceVersion":"1"}}`),
			`"verb":"patch",`, `"verb":"patch","VERB":"get","User":{"username":"mallory"},`, 1)
		facts, _ := decodeBody(t, eventList(ev))
		require.Len(t, facts, 1)
		require.Equal(t, "patch", facts[0].Verb)
		require.Equal(t, "alice", facts[0].User.Username)
	})
}

func TestDecodeMalformedEvent(t *testing.T) {
	good := fixtureEvents(t, "update.json", nil)[0]
	// metadata of the wrong type fails even a case-sensitive decode: it stands for any event
	// the decoder cannot read.
	poisoned := crEvent("poisoned-1", "patch", "w1", `{}`,
		`{"apiVersion":"example.com/v1","kind":"Widget","metadata":"SECRET-CONTENT"}`)
	badTime := strings.Replace(crEvent("bad-time", "patch", "w1", `{}`, `{"kind":"Widget","apiVersion":"example.com/v1","metadata":{}}`),
		`"stageTimestamp":"2026-11-30T01:30:00.123456Z"`, `"stageTimestamp":"yesterday"`, 1)
	body := eventList(poisoned, good, `null`, `7`, badTime, `{"auditID":["x"]}`)

	facts, stats := decodeBody(t, body)
	require.Len(t, facts, 1)
	require.Equal(t, onlyFact(t, "update.json"), facts[0])
	require.Equal(t, 6, stats.Events)
	require.Equal(t, map[DropReason]int{DropMalformed: 5}, stats.Dropped)
	require.Equal(t, []MalformedEvent{{Index: 0, AuditID: "poisoned-1"}, {Index: 2}, {Index: 3}, {Index: 4, AuditID: "bad-time"}, {Index: 5}}, stats.Malformed)
}

func TestDecodeCustomResourceKindStatus(t *testing.T) {
	status := func(meta string) string {
		return `{"apiVersion":"example.com/v1","kind":"Status","metadata":{` + meta + `},"details":{"uid":"not-this","name":"nor-this"},"spec":{}}`
	}
	// A custom resource named statuses.example.com, of kind Status.
	event := func(auditID, verb, req, resp string) string {
		return strings.ReplaceAll(crEvent(auditID, verb, "st", req, resp), "widgets", "statuses")
	}
	facts, stats := decodeBody(t, eventList(
		event("s-create", "create", `{"apiVersion":"example.com/v1","kind":"Status","metadata":{"name":"st"}}`,
			status(`"name":"st","namespace":"team-a","uid":"st-uid","resourceVersion":"11"`)),
		// A delete held by a finalizer answers the object, which is of kind Status here.
		event("s-delete", "delete", `{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/__internal"}`,
			status(`"name":"st","namespace":"team-a","uid":"st-uid","resourceVersion":"12","deletionTimestamp":"2026-11-30T01:30:00Z","finalizers":["example.com/hold"]`)),
	))
	require.Empty(t, stats.Dropped)
	require.Equal(t, []factView{
		{AuditID: "s-create", Verb: "create", User: "alice", Group: "example.com", Resource: "statuses", Namespace: "team-a", Name: "st", UID: "st-uid", RV: "11"},
		{AuditID: "s-delete", Verb: "delete", User: "alice", Group: "example.com", Resource: "statuses", Namespace: "team-a", Name: "st", UID: "st-uid", RV: "12", Terminating: true},
	}, []factView{viewOf(facts[0]), viewOf(facts[1])})
}

// TestDecodeTokenizer covers what the one-pass decoder treats specially: escapes in keys and
// values, unknown fields of any shape, deep and large bodies it skips, and duplicate keys.
func TestDecodeTokenizer(t *testing.T) {
	resp := `{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"team-a","uid":"w-uid","resourceVersion":"7001"}}`
	kept := func(t *testing.T, events ...string) []Fact {
		t.Helper()
		facts, stats := decodeBody(t, eventList(events...))
		require.Empty(t, stats.Dropped)
		return facts
	}
	dropped := func(t *testing.T, want DropReason, events ...string) DecodeStats {
		t.Helper()
		facts, stats := decodeBody(t, eventList(events...))
		require.Empty(t, facts)
		require.Equal(t, map[DropReason]int{want: len(events)}, stats.Dropped)
		return stats
	}

	t.Run("escaped keys and values are unescaped", func(t *testing.T) {
		ev := crEvent("esc-1", "patch", "", `{}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","meta\u0064ata":{"name":"w\u00e9\ud83d\ude00","namespace":"team-a","uid":"w\/uid\\\"q\"","resourceVersion":"7\u0030\u00301"}}`)
		ev = strings.Replace(ev, `"verb":"patch"`, `"v\u0065rb":"pat\u0063h"`, 1)
		ev = strings.Replace(ev, `"username":"alice"`, `"username":"al\u0069ce\tx\n"`, 1)
		facts := kept(t, ev)
		require.Len(t, facts, 1)
		require.Equal(t, "patch", facts[0].Verb)
		require.Equal(t, "wé😀", facts[0].Name)
		require.Equal(t, `w/uid\"q"`, facts[0].UID)
		require.Equal(t, "7001", facts[0].ResourceVersion)
		require.Equal(t, "alice\tx\n", facts[0].User.Username)
	})
	t.Run("an invalid surrogate or invalid UTF-8 becomes U+FFFD, as with encoding/json", func(t *testing.T) {
		ev := crEvent("utf-1", "patch", "", `{}`,
			`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a\ud800b","uid":"u-`+"\xff"+`","resourceVersion":"1"}}`)
		facts := kept(t, ev)
		require.Equal(t, "a\uFFFDb", facts[0].Name)
		require.Equal(t, "u-\uFFFD", facts[0].UID)
	})
	t.Run("an escaped & in the URI still parses its query", func(t *testing.T) {
		ev := strings.Replace(crEvent("q-1", "patch", "w1", `{}`, resp), `/widgets/w1"`, `/widgets/w1?fieldManager=x\u0026dry\u0052un=All"`, 1)
		dropped(t, DropDryRun, ev)
		ev = strings.Replace(crEvent("q-2", "patch", "w1", `{}`, resp), `/widgets/w1"`, `/widgets/w1?fieldManager=x\u0026dry%52un=All"`, 1)
		dropped(t, DropDryRun, ev)
	})
	t.Run("unknown fields of every shape are skipped", func(t *testing.T) {
		ev := strings.Replace(crEvent("u-1", "patch", "w1", `{}`, resp), `"verb":"patch",`,
			`"verb":"patch","x1":{"a":[1,-2.5e+3,true,false,null,{"b":"}"}]},"x2":[[],{}],"x3":"]","x4":-0,"x5":1E9,`, 1)
		require.Len(t, kept(t, ev), 1)
	})
	t.Run("huge and deeply nested bodies are skipped", func(t *testing.T) {
		deep := strings.Repeat(`{"a":[`, 4000) + `"x"` + strings.Repeat(`]}`, 4000)
		big := `"` + strings.Repeat("0123456789abcdef", 1<<16) + `"`
		body := `{"apiVersion":"example.com/v1","kind":"Widget","spec":` + deep + `,"data":` + big +
			`,"metadata":{"name":"w1","namespace":"team-a","uid":"w-uid","resourceVersion":"7001","annotations":{"deep":` + deep + `}}}`
		facts := kept(t, crEvent("big-1", "update", "w1", body, body))
		require.Equal(t, "7001", facts[0].ResourceVersion)
	})
	t.Run("nesting beyond the limit fails the batch", func(t *testing.T) {
		deep := strings.Repeat(`[`, maxDepth+1) + strings.Repeat(`]`, maxDepth+1)
		_, _, err := Decode(strings.NewReader(string(eventList(crEvent("d-1", "patch", "w1", deep, resp)))), "r")
		require.ErrorContains(t, err, "exceeded max depth")
	})
	t.Run("a duplicate of a field read here makes the event malformed", func(t *testing.T) {
		for name, ev := range map[string]string{
			"verb":     strings.Replace(crEvent("dup-1", "patch", "w1", `{}`, resp), `"verb":"patch",`, `"verb":"patch","verb":"get",`, 1),
			"user":     strings.Replace(crEvent("dup-1", "patch", "w1", `{}`, resp), `"user":{`, `"user":{"username":"mallory"},"user":{`, 1),
			"username": strings.Replace(crEvent("dup-1", "patch", "w1", `{}`, resp), `"username":"alice"`, `"username":"alice","username":"mallory"`, 1),
			"metadata": crEvent("dup-1", "patch", "w1", `{}`, `{"kind":"Widget","metadata":{"uid":"w-uid","resourceVersion":"1"},"metadata":{"uid":"forged"}}`),
			"resourceVersion": crEvent("dup-1", "patch", "w1", `{}`,
				`{"kind":"Widget","metadata":{"uid":"w-uid","resourceVersion":"1","resourceVersion":"2"}}`),
			"escaped duplicate": crEvent("dup-1", "patch", "w1", `{}`, `{"kind":"Widget","metadata":{"uid":"w-uid","\u0075id":"forged"}}`),
		} {
			t.Run(name, func(t *testing.T) {
				stats := dropped(t, DropMalformed, ev)
				require.Equal(t, []MalformedEvent{{Index: 0, AuditID: "dup-1"}}, stats.Malformed)
			})
		}
	})
	t.Run("duplicates of fields not read here are ignored", func(t *testing.T) {
		ev := crEvent("dup-2", "patch", "w1", `{"a":1,"a":2}`,
			`{"kind":"Widget","spec":{},"spec":[],"metadata":{"uid":"w-uid","resourceVersion":"1","labels":{},"labels":{}}}`)
		require.Len(t, kept(t, ev), 1)
	})
	t.Run("a wrong type in a field read here is malformed, and named", func(t *testing.T) {
		for name, ev := range map[string]string{
			"code as a string":   strings.Replace(crEvent("ty-1", "patch", "w1", `{}`, resp), `"code":200`, `"code":"200"`, 1),
			"code with fraction": strings.Replace(crEvent("ty-1", "patch", "w1", `{}`, resp), `"code":200`, `"code":200.0`, 1),
			"code out of range":  strings.Replace(crEvent("ty-1", "patch", "w1", `{}`, resp), `"code":200`, `"code":4294967496`, 1),
			"groups not a list":  strings.Replace(crEvent("ty-1", "patch", "w1", `{}`, resp), `"groups":["system:authenticated"]`, `"groups":"system:masters"`, 1),
			"a group not a string": strings.Replace(crEvent("ty-1", "patch", "w1", `{}`, resp), `"groups":["system:authenticated"]`,
				`"groups":["a",{}]`, 1),
			"objectRef a list":        strings.Replace(crEvent("ty-1", "patch", "w1", `{}`, resp), `"objectRef":{`, `"objectRef":[],"x":{`, 1),
			"responseObject a string": crEvent("ty-1", "patch", "w1", `{}`, `"Widget"`),
		} {
			t.Run(name, func(t *testing.T) {
				stats := dropped(t, DropMalformed, ev)
				require.Equal(t, []MalformedEvent{{Index: 0, AuditID: "ty-1"}}, stats.Malformed)
			})
		}
	})
	t.Run("a duplicate list field fails the batch", func(t *testing.T) {
		_, _, err := Decode(strings.NewReader(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[],"items":[]}`), "r")
		require.ErrorContains(t, err, `duplicate field "items"`)
	})
	t.Run("syntax errors anywhere fail the batch, naming the offset and at most one character", func(t *testing.T) {
		for _, body := range []string{
			string(eventList(crEvent("s-1", "patch", "w1", `{"a":tru}`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `{"a":"\x"}`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `{"a":"`+"\n"+`"}`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `{"a":01}`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `{"a":1.}`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `{"a" 1}`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `[1,]`, resp))),
			string(eventList(crEvent("s-1", "patch", "w1", `{"a":"\u12"}`, resp))),
			`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[]`,
		} {
			facts, _, err := Decode(strings.NewReader(body), "r")
			require.ErrorContains(t, err, "invalid JSON at offset", body)
			require.Nil(t, facts)
			require.Less(t, len(err.Error()), 200)
		}
	})
}

// TestDecodeAgreesWithEncodingJSON checks the tokenizer's syntax verdict against json.Valid on
// the fixtures cut at every few bytes: a body is decoded exactly when it is valid JSON.
func TestDecodeAgreesWithEncodingJSON(t *testing.T) {
	for _, file := range []string{"delete-finalizer.json", "deletecollection.json", "scale.json", "apply.json"} {
		body := fixture(t, filepath.Join("testdata", file))
		for cut := 0; cut <= len(body); cut += 7 {
			b := body[:cut]
			_, _, err := Decode(bytes.NewReader(b), "r")
			if json.Valid(b) {
				require.NoError(t, err, "%s cut at %d", file, cut)
			} else {
				require.ErrorContains(t, err, "invalid JSON", "%s cut at %d", file, cut)
			}
		}
	}
}
