package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// syntheticBatch builds an audit.k8s.io/v1 EventList of n RequestResponse patch events on
// Deployments, shaped like what the apiserver sends with kubescribe's policy (managedFields
// omitted): a patch request and the full object in the response.
func syntheticBatch(tb testing.TB, n int) []byte {
	tb.Helper()
	list := auditv1.EventList{TypeMeta: metav1.TypeMeta{Kind: "EventList", APIVersion: "audit.k8s.io/v1"}}
	ts := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	for i := range n {
		name := fmt.Sprintf("web-%04d", i)
		uid := fmt.Sprintf("0b6f4c2e-8d1a-4f5e-9c3b-%012d", i)
		rv := fmt.Sprintf("%d", 100000+i)
		resp := fmt.Sprintf(deploymentJSON, name, uid, rv, name, name, name, i%5+1)
		req := fmt.Sprintf(`{"spec":{"replicas":%d,"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-11-30T01:00:%02dZ"}}}}}`, i%5+1, i%60)
		list.Items = append(list.Items, auditv1.Event{
			TypeMeta:   metav1.TypeMeta{Kind: "Event", APIVersion: "audit.k8s.io/v1"},
			Level:      auditv1.LevelRequestResponse,
			AuditID:    types.UID(fmt.Sprintf("5d9a7e1c-2b4f-4e6a-8c1d-%012d", i)),
			Stage:      auditv1.StageResponseComplete,
			RequestURI: "/apis/apps/v1/namespaces/team-a/deployments/" + name + "?fieldManager=kubectl-edit",
			Verb:       "patch",
			User: authnv1.UserInfo{
				Username: "alice@example.com",
				UID:      "b7c1d2e3-0000-4000-8000-000000000001",
				Groups:   []string{"devs", "system:authenticated"},
				Extra:    map[string]authnv1.ExtraValue{"authentication.kubernetes.io/credential-id": {"JTI=3f0c9a7e-1d2b-4c5e-8f6a-7b8c9d0e1f2a"}},
			},
			SourceIPs: []string{"10.0.12.34"},
			UserAgent: "kubectl/v1.37.2 (linux/amd64) kubernetes/0123abc",
			ObjectRef: &auditv1.ObjectReference{
				Resource: "deployments", Namespace: "team-a", Name: name, APIGroup: "apps", APIVersion: "v1",
			},
			ResponseStatus:           &metav1.Status{Code: 200},
			RequestObject:            &runtime.Unknown{Raw: []byte(req), ContentType: runtime.ContentTypeJSON},
			ResponseObject:           &runtime.Unknown{Raw: []byte(resp), ContentType: runtime.ContentTypeJSON},
			RequestReceivedTimestamp: metav1.NewMicroTime(ts),
			StageTimestamp:           metav1.NewMicroTime(ts.Add(3 * time.Millisecond)),
			Annotations: map[string]string{
				"authorization.k8s.io/decision": "allow",
				"authorization.k8s.io/reason":   `RBAC: allowed by RoleBinding "devs/team-a" of ClusterRole "edit" to Group "devs"`,
			},
		})
	}
	b, err := json.Marshal(list)
	require.NoError(tb, err)
	return b
}

const deploymentJSON = `{"kind":"Deployment","apiVersion":"apps/v1","metadata":{"name":"%s","namespace":"team-a",` +
	`"uid":"%s","resourceVersion":"%s","generation":7,"creationTimestamp":"2026-11-01T10:00:00Z",` +
	`"labels":{"app.kubernetes.io/name":"%s","app.kubernetes.io/part-of":"shop","team":"a"},` +
	`"annotations":{"deployment.kubernetes.io/revision":"7"}},` +
	`"spec":{"replicas":2,"selector":{"matchLabels":{"app.kubernetes.io/name":"%s"}},"template":{"metadata":{"creationTimestamp":null,` +
	`"labels":{"app.kubernetes.io/name":"%s","team":"a"}},"spec":{"containers":[{"name":"web","image":"registry.example.com/shop/web:1.4.2",` +
	`"ports":[{"name":"http","containerPort":8080,"protocol":"TCP"}],"env":[{"name":"LOG_LEVEL","value":"info"},{"name":"CACHE_URL","value":"redis://cache:6379"}],` +
	`"resources":{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},` +
	`"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}],` +
	`"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","securityContext":{},"schedulerName":"default-scheduler"}},` +
	`"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"25%%","maxSurge":"25%%"}},"revisionHistoryLimit":10,"progressDeadlineSeconds":600},` +
	`"status":{"observedGeneration":6,"replicas":%d,"updatedReplicas":2,"readyReplicas":2,"availableReplicas":2,` +
	`"conditions":[{"type":"Available","status":"True","lastUpdateTime":"2026-11-29T10:00:00Z","lastTransitionTime":"2026-11-29T10:00:00Z","reason":"MinimumReplicasAvailable","message":"Deployment has minimum availability."},` +
	`{"type":"Progressing","status":"True","lastUpdateTime":"2026-11-29T10:00:00Z","lastTransitionTime":"2026-11-01T10:00:00Z","reason":"NewReplicaSetAvailable","message":"ReplicaSet \"web-5d8f7c9b6d\" has successfully progressed."}]}}`

func TestSyntheticBatch(t *testing.T) {
	body := syntheticBatch(t, 400)
	require.Greater(t, len(body), 900_000, "a 400-event batch is about 1 MB")
	require.Less(t, len(body), 1_300_000)
	facts, stats, err := Decode(bytes.NewReader(body), "bench")
	require.NoError(t, err)
	require.Equal(t, 400, stats.Kept)
	require.Equal(t, "web-0399", facts[399].Name)
	require.Equal(t, "100399", facts[399].ResourceVersion)
	require.Equal(t, "0b6f4c2e-8d1a-4f5e-9c3b-000000000399", facts[399].UID)
}

// capturedBatch returns the real captured events of testdata/*.json, compacted as the apiserver
// sends them, cycled to n events in one EventList.
func capturedBatch(tb testing.TB, n int) []byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(tb, err)
	var events []json.RawMessage
	for _, f := range files {
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		require.NoError(tb, json.Unmarshal(fixture(tb, f), &list))
		for _, ev := range list.Items {
			var c bytes.Buffer
			require.NoError(tb, json.Compact(&c, ev))
			events = append(events, c.Bytes())
		}
	}
	require.NotEmpty(tb, events)
	items := make([]string, n)
	for i := range items {
		items[i] = string(events[i%len(events)])
	}
	return eventList(items...)
}

func TestCapturedBatch(t *testing.T) {
	body := capturedBatch(t, 400)
	facts, stats, err := Decode(bytes.NewReader(body), "bench")
	require.NoError(t, err)
	require.Equal(t, 400, stats.Events)
	require.NotEmpty(t, facts)
}

// decodePooled is what the handler runs: the pooled decoder, released after use.
func decodePooled(body []byte, route string) (int, error) {
	d := getDecoder()
	defer putDecoder(d)
	facts, _, err := d.decode(body, route)
	return len(facts), err
}
