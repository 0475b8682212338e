package audit

import (
	"bytes"
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
		{name: "not an object", body: `[1,2]`, wantErr: "cannot use a JSON array"},
		{name: "trailing garbage", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[]} x`, wantErr: "invalid JSON"},
		{name: "wrong kind", body: `{"kind":"Event","apiVersion":"audit.k8s.io/v1"}`, wantErr: `kind "Event"`},
		{name: "wrong version", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1beta1","items":[]}`, wantErr: `apiVersion "audit.k8s.io/v1beta1"`},
		{name: "no type", body: `{"items":[]}`, wantErr: "unsupported body"},
		{name: "items not a list", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":{}}`, wantErr: `field "items"`},
		{name: "bad timestamp", body: `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[{"stageTimestamp":"yesterday"}]}`, wantErr: "decoding"},
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
