//go:build capture

package controlplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
)

// fixtureDir is where the captured EventLists go, relative to this package.
const fixtureDir = "../../internal/audit/testdata"

// captureNamespace holds every object the scenarios write.
const captureNamespace = "capture"

// TestCapture records the audit events kube-apiserver sends for each write kubescribe must
// attribute and writes them to internal/audit/testdata/<scenario>.json, one EventList per
// scenario with its events in request order. Run it with
//
//	KUBE_APISERVER=$PWD/bin/kube-apiserver go test -tags capture -run TestCapture ./test/controlplane/
func TestCapture(t *testing.T) {
	cp := startForTest(t)
	ctx := t.Context()

	rec := newAuditRecorder()
	serveAudit(t, cp, func(r *http.Request, body []byte) {
		if r.URL.Path != "/audit/local" {
			t.Errorf("audit request for unexpected path %q", r.URL.Path)
		}
		rec.addBatch(t, body)
	})
	// The endpoint must be shut after the apiserver, or the apiserver spends its shutdown
	// retrying to deliver; t.Cleanup runs last-registered first.
	t.Cleanup(func() { require.NoError(t, cp.Stop()) })

	clientFor := func(user string, impersonate string) *kubernetes.Clientset {
		cfg := cp.UserConfig(user)
		cfg.UserAgent = "kubescribe-capture/" + user
		cfg.Impersonate.UserName = impersonate
		cfg.WrapTransport = rec.wrap
		return kubernetes.NewForConfigOrDie(cfg)
	}
	admin := clientFor("admin", "")
	alice := clientFor("alice", "")
	bob := clientFor("bob", "")
	adminAsAlice := clientFor("admin", "alice")
	cms := alice.CoreV1().ConfigMaps(captureNamespace)

	rec.scenario("setup")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: captureNamespace}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().Roles(captureNamespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "editor"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "deployments/scale"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().RoleBindings(captureNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-editor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "editor"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// authorization.k8s.io is not audited (policy level None): ask with a client that records
	// no audit IDs.
	plainAdmin := kubernetes.NewForConfigOrDie(cp.AdminConfig)
	require.Eventually(t, func() bool {
		sar, err := plainAdmin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:               "alice",
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: captureNamespace, Verb: "deletecollection", Resource: "configmaps"},
		}}, metav1.CreateOptions{})
		return err == nil && sar.Status.Allowed
	}, 10*time.Second, 100*time.Millisecond, "alice's Role never took effect")

	rec.scenario("create")
	created, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "demo", Labels: map[string]string{"app": "demo"}},
		Data:       map[string]string{"greeting": "hello"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	rec.scenario("create-generatename")
	_, err = cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "demo-"},
		Data:       map[string]string{"greeting": "generated"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	rec.scenario("update")
	created.Data["greeting"] = "hi"
	_, err = cms.Update(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)

	rec.scenario("patch")
	patch := []byte(`{"data":{"greeting":"hey"}}`)
	_, err = cms.Patch(ctx, "demo", types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)

	rec.scenario("patch-noop")
	_, err = cms.Patch(ctx, "demo", types.MergePatchType, patch, metav1.PatchOptions{})
	require.NoError(t, err)

	applyCM := corev1ac.ConfigMap("applied", captureNamespace).WithData(map[string]string{"mode": "server-side"})
	rec.scenario("apply")
	_, err = cms.Apply(ctx, applyCM, metav1.ApplyOptions{FieldManager: "alice-apply", Force: true})
	require.NoError(t, err)

	rec.scenario("apply-noop")
	_, err = cms.Apply(ctx, applyCM, metav1.ApplyOptions{FieldManager: "alice-apply", Force: true})
	require.NoError(t, err)

	rec.scenario("delete")
	require.NoError(t, cms.Delete(ctx, "demo", metav1.DeleteOptions{}))

	rec.scenario("delete-finalizer")
	_, err = cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{"kubescribe.test/hold"}},
		Data:       map[string]string{"state": "held"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, cms.Delete(ctx, "held", metav1.DeleteOptions{}))
	_, err = admin.CoreV1().ConfigMaps(captureNamespace).Patch(ctx, "held", types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	_, err = cms.Get(ctx, "held", metav1.GetOptions{}) // reads are not audited
	require.True(t, apierrors.IsNotFound(err), "the finalizer-removing patch must complete the deletion, got %v", err)

	rec.scenario("deletecollection")
	for _, name := range []string{"batch-1", "batch-2"} {
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"capture": "deletecollection"}},
			Data:       map[string]string{"name": name},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, cms.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "capture=deletecollection"}))

	rec.scenario("dryrun")
	_, err = cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "dry"},
		Data:       map[string]string{"dry": "run"},
	}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	require.NoError(t, err)

	rec.scenario("forbidden")
	_, err = bob.CoreV1().ConfigMaps(captureNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "bobs"},
		Data:       map[string]string{"by": "bob"},
	}, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "bob's create: want Forbidden, got %v", err)

	rec.scenario("impersonated")
	_, err = adminAsAlice.CoreV1().ConfigMaps(captureNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "impersonated"},
		Data:       map[string]string{"by": "admin as alice"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	rec.scenario("scale")
	replicas := int32(1)
	deploys := alice.AppsV1().Deployments(captureNamespace)
	_, err = deploys.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = deploys.UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: captureNamespace},
		Spec:       autoscalingv1.ScaleSpec{Replicas: 3},
	}, metav1.UpdateOptions{})
	require.NoError(t, err)
	// kubectl scale sends a merge patch to the scale subresource.
	_, err = deploys.Patch(ctx, "web", types.MergePatchType, []byte(`{"spec":{"replicas":2}}`), metav1.PatchOptions{}, "scale")
	require.NoError(t, err)
	rec.scenario("")

	require.Eventually(t, rec.complete, 60*time.Second, 200*time.Millisecond,
		"audit events missing for: %v", rec.missing)

	require.NoError(t, os.MkdirAll(fixtureDir, 0o755))
	for _, sc := range rec.order {
		items := rec.eventsFor(sc)
		out, err := eventList(items)
		require.NoError(t, err)
		path := filepath.Join(fixtureDir, sc+".json")
		require.NoError(t, os.WriteFile(path, out, 0o644))
		t.Logf("%s: %d events", path, len(items))
	}
	others := rec.unrelated()
	t.Logf("%d events of other requests (the apiserver's own writes) were received and not saved", len(others))
	for _, e := range others {
		t.Logf("  unrelated: %s", summarize(e))
	}
	for _, sc := range rec.order {
		for _, e := range rec.eventsFor(sc) {
			t.Logf("%-20s %s", sc, summarize(e))
		}
	}
	checkDocumentedFacts(t, rec)
}

// checkDocumentedFacts re-checks what internal/audit/testdata/README.md (and the design's
// join rules) say about these events, so a recapture from another apiserver version that
// behaves differently does not pass unnoticed.
func checkDocumentedFacts(t *testing.T, rec *auditRecorder) {
	type event struct {
		Verb      string
		ObjectRef struct {
			Name, UID, ResourceVersion, Subresource string
		}
		ResponseStatus   struct{ Code int }
		ImpersonatedUser *struct{ Username string }
		ResponseObject   struct {
			Kind     string
			Metadata struct {
				UID, ResourceVersion, DeletionTimestamp string
			}
			Details struct{ UID string }
		}
	}
	get := func(scenario string) []event {
		var out []event
		for _, raw := range rec.eventsFor(scenario) {
			var e event
			require.NoError(t, json.Unmarshal(raw, &e))
			out = append(out, e)
		}
		require.NotEmpty(t, out, "no events for %s", scenario)
		return out
	}
	fact := func(ok bool, format string, args ...any) {
		t.Helper()
		if !ok {
			t.Errorf("documented fact no longer holds (update internal/audit/testdata/README.md): "+format, args...)
		}
	}

	create := get("create")[0]
	fact(create.ObjectRef.UID == "" && create.ObjectRef.ResourceVersion == "", "a create's objectRef carries no uid or resourceVersion: %+v", create.ObjectRef)
	fact(create.ResponseObject.Metadata.UID != "" && create.ResponseObject.Metadata.ResourceVersion != "", "a create's responseObject carries uid and resourceVersion")
	fact(get("create-generatename")[0].ObjectRef.Name == "", "a generateName create's objectRef has no name")

	update := get("update")[0]
	fact(update.ObjectRef.UID != "" && update.ObjectRef.ResourceVersion != update.ResponseObject.Metadata.ResourceVersion,
		"an update's objectRef carries the uid and the request's (pre-write) resourceVersion: %+v", update.ObjectRef)
	fact(get("patch-noop")[0].ResponseObject.Metadata.ResourceVersion == get("patch")[0].ResponseObject.Metadata.ResourceVersion,
		"a no-op patch returns the unchanged resourceVersion")
	apply, applyNoop := get("apply")[0], get("apply-noop")[0]
	fact(apply.Verb == "patch" && apply.ResponseStatus.Code == 201 && applyNoop.ResponseStatus.Code == 200,
		"server-side apply is verb patch, 201 when it creates, 200 otherwise")
	fact(applyNoop.ResponseObject.Metadata.ResourceVersion == apply.ResponseObject.Metadata.ResourceVersion,
		"a no-op apply returns the unchanged resourceVersion")

	del := get("delete")[0]
	fact(del.ResponseObject.Kind == "Status" && del.ResponseObject.Details.UID != "" && del.ResponseObject.Metadata.ResourceVersion == "",
		"an immediate delete answers a Status whose details carry the uid, and no resourceVersion: %+v", del.ResponseObject)
	held := get("delete-finalizer")
	fact(len(held) == 3, "delete-finalizer has create, delete, patch")
	if len(held) == 3 {
		fact(held[1].ResponseObject.Kind == "ConfigMap" && held[1].ResponseObject.Metadata.DeletionTimestamp != "",
			"a delete held by a finalizer answers the object with deletionTimestamp set")
		fact(held[2].ResponseObject.Metadata.ResourceVersion == held[1].ResponseObject.Metadata.ResourceVersion,
			"the finalizer-removing patch returns the held delete's resourceVersion (%s vs %s)",
			held[2].ResponseObject.Metadata.ResourceVersion, held[1].ResponseObject.Metadata.ResourceVersion)
	}
	dc := get("deletecollection")
	fact(dc[len(dc)-1].ResponseObject.Kind == "ConfigMapList" && dc[len(dc)-1].ObjectRef.Name == "",
		"deletecollection answers the list of deleted objects; its objectRef has no name")
	dry := get("dryrun")[0]
	fact(dry.ResponseObject.Metadata.ResourceVersion == "" && dry.ResponseObject.Metadata.UID != "",
		"a dry-run create answers a uid but no resourceVersion")
	forbidden := get("forbidden")[0]
	fact(forbidden.ResponseStatus.Code == 403 && forbidden.ObjectRef.Name == "",
		"a forbidden create is audited with 403 and an objectRef without name")
	imp := get("impersonated")[0]
	fact(imp.ImpersonatedUser != nil && imp.ImpersonatedUser.Username == "alice", "impersonatedUser names the impersonated user")
	scale := get("scale")
	fact(scale[1].ObjectRef.Subresource == "scale" && scale[1].ResponseObject.Kind == "Scale" &&
		scale[1].ResponseObject.Metadata.UID == scale[0].ResponseObject.Metadata.UID,
		"a scale update names subresource scale and answers a Scale carrying the Deployment's uid")
}

// auditRecorder pairs requests with their audit events: the client side records each
// response's Audit-Id header under the current scenario; the audit endpoint stores every
// event by auditID.
type auditRecorder struct {
	mu       sync.Mutex
	current  string
	order    []string            // scenarios in the order they ran
	ids      map[string][]string // scenario -> audit IDs in request order
	idsSeen  map[string]bool
	events   map[string][]json.RawMessage // audit ID -> events (normally one: ResponseComplete)
	arrivals []string                     // audit IDs in arrival order
}

func newAuditRecorder() *auditRecorder {
	return &auditRecorder{ids: map[string][]string{}, idsSeen: map[string]bool{}, events: map[string][]json.RawMessage{}}
}

func (r *auditRecorder) scenario(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.current = name
	if name != "" {
		r.order = append(r.order, name)
	}
}

func (r *auditRecorder) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		// Reads are not audited (policy level None); only writes are paired with events.
		if req.Method == http.MethodGet {
			return resp, nil
		}
		id := resp.Header.Get("Audit-Id")
		r.mu.Lock()
		defer r.mu.Unlock()
		if id != "" && r.current != "" && !r.idsSeen[id] {
			r.idsSeen[id] = true
			r.ids[r.current] = append(r.ids[r.current], id)
		}
		return resp, nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (r *auditRecorder) addBatch(t *testing.T, body []byte) {
	var list struct {
		Kind       string            `json:"kind"`
		APIVersion string            `json:"apiVersion"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Errorf("undecodable audit batch: %v", err)
		return
	}
	if list.Kind != "EventList" || list.APIVersion != "audit.k8s.io/v1" {
		t.Errorf("audit batch is %s %s, want audit.k8s.io/v1 EventList", list.APIVersion, list.Kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, item := range list.Items {
		var e struct {
			AuditID string `json:"auditID"`
		}
		if err := json.Unmarshal(item, &e); err != nil {
			t.Errorf("undecodable audit event: %v", err)
			continue
		}
		if _, ok := r.events[e.AuditID]; !ok {
			r.arrivals = append(r.arrivals, e.AuditID)
		}
		r.events[e.AuditID] = append(r.events[e.AuditID], append(json.RawMessage(nil), item...))
	}
}

func (r *auditRecorder) missing() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, sc := range r.order {
		for _, id := range r.ids[sc] {
			if len(r.events[id]) == 0 {
				out = append(out, sc+"/"+id)
			}
		}
	}
	return out
}

func (r *auditRecorder) complete() bool { return len(r.missing()) == 0 }

func (r *auditRecorder) eventsFor(scenario string) []json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []json.RawMessage
	for _, id := range r.ids[scenario] {
		out = append(out, r.events[id]...)
	}
	return out
}

func (r *auditRecorder) unrelated() []json.RawMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []json.RawMessage
	for _, id := range r.arrivals {
		if !r.idsSeen[id] {
			out = append(out, r.events[id]...)
		}
	}
	return out
}

// eventList renders items as an indented audit.k8s.io/v1 EventList, each event byte for byte
// as the apiserver sent it (only re-indented).
func eventList(items []json.RawMessage) ([]byte, error) {
	var compact bytes.Buffer
	compact.WriteString(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[`)
	for i, item := range items {
		if i > 0 {
			compact.WriteByte(',')
		}
		compact.Write(item)
	}
	compact.WriteString("]}")
	var out bytes.Buffer
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// summarize condenses an event into one line for the test log.
func summarize(raw json.RawMessage) string {
	var e struct {
		Verb             string `json:"verb"`
		Stage            string `json:"stage"`
		RequestURI       string `json:"requestURI"`
		User             struct{ Username string }
		ImpersonatedUser *struct{ Username string } `json:"impersonatedUser"`
		ObjectRef        map[string]any             `json:"objectRef"`
		ResponseStatus   struct{ Code int }         `json:"responseStatus"`
		ResponseObject   struct {
			Kind     string `json:"kind"`
			Metadata struct {
				UID               string `json:"uid"`
				ResourceVersion   string `json:"resourceVersion"`
				DeletionTimestamp string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Details map[string]any `json:"details"`
		} `json:"responseObject"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return "undecodable: " + err.Error()
	}
	user := e.User.Username
	if e.ImpersonatedUser != nil {
		user += " as " + e.ImpersonatedUser.Username
	}
	keys := make([]string, 0, len(e.ObjectRef))
	for k := range e.ObjectRef {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var ref []string
	for _, k := range keys {
		ref = append(ref, fmt.Sprintf("%s=%v", k, e.ObjectRef[k]))
	}
	m := e.ResponseObject.Metadata
	return fmt.Sprintf("%s %s %d by %s; %s; objectRef{%s}; response %s uid=%q rv=%q deletionTimestamp=%q details=%v",
		e.Stage, e.Verb, e.ResponseStatus.Code, user, e.RequestURI, strings.Join(ref, " "),
		e.ResponseObject.Kind, m.UID, m.ResourceVersion, m.DeletionTimestamp, e.ResponseObject.Details)
}
