package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// hidingProxy stands between kubescribe and the apiserver and makes the apiserver look as if
// it did not serve one API group: the group is left out of discovery and its paths answer 404.
// kube-apiserver itself refuses to start with apiregistration.k8s.io/v1 disabled ("API
// group/version apiregistration.k8s.io/v1 must be enabled"), so a test of a server without it
// hides it this way. The proxy talks to the apiserver with upstream's credentials; kubescribe
// talks to the proxy over plain HTTP on the loopback interface.
type hidingProxy struct {
	group    string
	upstream *url.URL
	client   *http.Client
	proxy    *httputil.ReverseProxy
}

// startHidingProxy starts the proxy in front of upstream and returns the rest config that
// reaches the apiserver through it. It stops with the test.
func startHidingProxy(t *testing.T, upstream *rest.Config, group string) (*rest.Config, error) {
	rt, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	p := &hidingProxy{group: group, upstream: u, client: &http.Client{Transport: rt}}
	p.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Header.Del("Authorization") // the transport authenticates
		},
		Transport:     rt,
		FlushInterval: -1, // watches stream
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: p}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cfg := &rest.Config{Host: "http://" + ln.Addr().String(), QPS: upstream.QPS, Burst: upstream.Burst, UserAgent: upstream.UserAgent}
	return cfg, nil
}

func (p *hidingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/apis" || r.URL.Path == "/apis/":
		p.serveGroupList(w, r)
	case r.URL.Path == "/apis/"+p.group || strings.HasPrefix(r.URL.Path, "/apis/"+p.group+"/"):
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound,
			Message: "the server could not find the requested resource",
		})
	default:
		p.proxy.ServeHTTP(w, r)
	}
}

// serveGroupList answers /apis with the legacy (unaggregated) group list without the hidden
// group; client-go's discovery falls back to it when the answer is not aggregated discovery.
func (p *hidingProxy) serveGroupList(w http.ResponseWriter, r *http.Request) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, p.upstream.JoinPath("/apis").String(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set("Accept", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		http.Error(w, fmt.Sprintf("upstream /apis: %d %v", resp.StatusCode, err), http.StatusBadGateway)
		return
	}
	var list metav1.APIGroupList
	if err := json.Unmarshal(body, &list); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	list.Groups = slices.DeleteFunc(list.Groups, func(g metav1.APIGroup) bool { return g.Name == p.group })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}
