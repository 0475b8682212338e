// Package hostileapi is a tiny Kubernetes API server that does not conform: over real TLS it
// serves discovery and list/watch of the resources a test gives it, answering every list with
// every object it holds, whatever namespace was asked for, and whatever names and namespaces
// those objects carry ("..", ".git", "a/b", ...). Tests point a remote source cluster's
// kubeconfig at it to play the hostile remote a real apiserver never is.
package hostileapi

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Object is one object the server lists: apiVersion, kind, uid, resourceVersion and
// creationTimestamp are filled in.
type Object struct {
	Namespace, Name string
	Data            map[string]string
}

// Resource is one resource the server serves, namespaced, with get, list and watch.
type Resource struct {
	Group, Version string // Group "" is the core group
	Name, Kind     string
	Objects        []Object
}

func (r Resource) apiVersion() string {
	if r.Group == "" {
		return r.Version
	}
	return r.Group + "/" + r.Version
}

// Server is the running server.
type Server struct {
	*httptest.Server
	resources []Resource
	done      chan struct{}
	fail      atomic.Pointer[failure]
	// Lists and Watches count the list and watch requests answered.
	Lists, Watches atomic.Int64
}

// failure is the answer Fail sets.
type failure struct {
	code        int
	contentType string
	body        string
}

// Fail makes the server answer every request from now on with code, contentType and body
// (an error whose text a client might copy); code 0 serves normally again.
func (s *Server) Fail(code int, contentType, body string) {
	if code == 0 {
		s.fail.Store(nil)
		return
	}
	s.fail.Store(&failure{code: code, contentType: contentType, body: body})
}

// resourceVersion is the version of every object and list.
const resourceVersion = "5"

// Start serves resources over TLS until Close.
func Start(resources ...Resource) *Server {
	s := &Server{resources: resources, done: make(chan struct{})}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	return s
}

// Close ends the watches it holds open, then the server.
func (s *Server) Close() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.Server.Close()
}

// Kubeconfig is a kubeconfig for the server: its CA inline, a bearer token it ignores.
func (s *Server) Kubeconfig() ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["hostile"] = &clientcmdapi.Cluster{Server: s.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})}
	cfg.AuthInfos["kubescribe"] = &clientcmdapi.AuthInfo{Token: "not-checked"}
	cfg.Contexts["hostile"] = &clientcmdapi.Context{Cluster: "hostile", AuthInfo: "kubescribe"}
	cfg.CurrentContext = "hostile"
	return clientcmd.Write(*cfg)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if f := s.fail.Load(); f != nil {
		w.Header().Set("Content-Type", f.contentType)
		w.WriteHeader(f.code)
		_, _ = w.Write([]byte(f.body))
		return
	}
	if r.Method != http.MethodGet {
		writeJSON(w, http.StatusMethodNotAllowed, status(http.StatusMethodNotAllowed, "MethodNotAllowed"))
		return
	}
	p := strings.Trim(r.URL.Path, "/")
	switch {
	case p == "version":
		writeJSON(w, http.StatusOK, map[string]any{"major": "1", "minor": "37", "gitVersion": "v1.37.2"})
		return
	case p == "api":
		writeJSON(w, http.StatusOK, map[string]any{"kind": "APIVersions", "versions": []string{"v1"},
			"serverAddressByClientCIDRs": []any{map[string]any{"clientCIDR": "0.0.0.0/0", "serverAddress": r.Host}}})
		return
	case p == "apis":
		writeJSON(w, http.StatusOK, s.groupList())
		return
	}
	parts := strings.Split(p, "/")
	var group, version string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		version, parts = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, version, parts = parts[1], parts[2], parts[3:]
	default:
		writeJSON(w, http.StatusNotFound, status(http.StatusNotFound, "NotFound"))
		return
	}
	if len(parts) == 0 {
		writeJSON(w, http.StatusOK, s.resourceList(group, version))
		return
	}
	if len(parts) == 3 && parts[0] == "namespaces" {
		parts = parts[2:] // the namespace asked for is ignored: every object is answered
	}
	if len(parts) != 1 {
		writeJSON(w, http.StatusNotFound, status(http.StatusNotFound, "NotFound"))
		return
	}
	res, ok := s.find(group, version, parts[0])
	if !ok {
		writeJSON(w, http.StatusNotFound, status(http.StatusNotFound, "NotFound"))
		return
	}
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		s.watch(w, r)
		return
	}
	s.Lists.Add(1)
	items := make([]any, 0, len(res.Objects))
	for i, o := range res.Objects {
		items = append(items, object(res, i, o))
	}
	writeJSON(w, http.StatusOK, map[string]any{"apiVersion": res.apiVersion(), "kind": res.Kind + "List",
		"metadata": map[string]any{"resourceVersion": resourceVersion}, "items": items})
}

// watch answers a watch-list request (sendInitialEvents) with an error, so that client-go
// lists instead, and holds any other watch open without an event until the client leaves.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("sendInitialEvents") == "true" {
		writeJSON(w, http.StatusUnprocessableEntity, status(http.StatusUnprocessableEntity, "Invalid"))
		return
	}
	s.Watches.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	select {
	case <-r.Context().Done():
	case <-s.done:
	}
}

func object(res Resource, i int, o Object) map[string]any {
	meta := map[string]any{"name": o.Name, "uid": fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1),
		"resourceVersion": resourceVersion, "creationTimestamp": "2026-01-01T00:00:00Z"}
	if o.Namespace != "" {
		meta["namespace"] = o.Namespace
	}
	out := map[string]any{"apiVersion": res.apiVersion(), "kind": res.Kind, "metadata": meta}
	if o.Data != nil {
		out["data"] = o.Data
	}
	return out
}

func (s *Server) find(group, version, name string) (Resource, bool) {
	for _, r := range s.resources {
		if r.Group == group && r.Version == version && r.Name == name {
			return r, true
		}
	}
	return Resource{}, false
}

func (s *Server) groupList() map[string]any {
	var groups []any
	seen := map[string]bool{}
	for _, r := range s.resources {
		if r.Group == "" || seen[r.Group] {
			continue
		}
		seen[r.Group] = true
		gv := map[string]any{"groupVersion": r.apiVersion(), "version": r.Version}
		groups = append(groups, map[string]any{"name": r.Group, "versions": []any{gv}, "preferredVersion": gv})
	}
	return map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
}

func (s *Server) resourceList(group, version string) map[string]any {
	gv := version
	if group != "" {
		gv = group + "/" + version
	}
	var list []any
	for _, r := range s.resources {
		if r.Group == group && r.Version == version {
			list = append(list, map[string]any{"name": r.Name, "singularName": "", "namespaced": true, "kind": r.Kind,
				"verbs": []string{"get", "list", "watch"}})
		}
	}
	return map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}
}

func status(code int, reason string) map[string]any {
	return map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
		"message": strings.ToLower(reason)}
}
