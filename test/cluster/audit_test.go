package cluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/test/cluster"
)

// auditSink is an HTTPS endpoint on the node IP that keeps what the apiserver's audit webhook
// posts, requiring the client certificate the webhook kubeconfig carries.
type auditSink struct {
	srv *http.Server
	url string

	mu     sync.Mutex
	events []auditEvent
}

type auditEvent struct {
	Verb      string                    `json:"verb"`
	User      struct{ Username string } `json:"user"`
	ObjectRef *struct {
		Resource, Namespace, Name string
	} `json:"objectRef"`
}

func startAuditSink(t *testing.T, c *cluster.Cluster) *auditSink {
	t.Helper()
	certPEM, keyPEM, err := c.CA.Issue("audit-sink", nil, []net.IP{net.ParseIP(cluster.NodeIP)}, false)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CA.CertPEM)
	l, err := tls.Listen("tcp", net.JoinHostPort(cluster.NodeIP, "0"), &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &auditSink{url: "https://" + l.Addr().String() + "/audit/local"}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var list struct{ Items []auditEvent }
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &list); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.events = append(s.events, list.Items...)
		s.mu.Unlock()
	})}
	go s.srv.Serve(l)
	return s
}

func (s *auditSink) close() { s.srv.Close() }

func (s *auditSink) find(verb, user, resource, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.events {
		if e.Verb == verb && e.User.Username == user && e.ObjectRef != nil && e.ObjectRef.Resource == resource && e.ObjectRef.Name == name {
			return true
		}
	}
	return false
}

// auditWebhook restarts the apiserver with kubescribe's audit policy and a webhook to sink
// (Cluster.SetAudit), and sees a user's write arrive there.
func auditWebhook(ctx context.Context, t *testing.T, c *cluster.Cluster, sink *auditSink) {
	clientCert, clientKey, err := c.CA.Issue("kube-apiserver", nil, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := audit.WebhookKubeconfig(audit.WebhookConfig{URL: sink.url, CAData: c.CA.CertPEM, ClientCertData: clientCert, ClientKeyData: clientKey})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := c.SetAudit(ctx, &cluster.Audit{Policy: audit.Policy(), WebhookKubeconfig: kubeconfig, BatchMaxWait: time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver restarted with the audit webhook in %s", time.Since(began).Round(100*time.Millisecond))

	admin, err := kubernetes.NewForConfig(c.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings("default").Create(ctx, roleBinding("alice-edit", "alice"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alice, err := kubernetes.NewForConfig(c.UserConfig("alice"))
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("audited-%d", time.Now().UnixNano())
	poll(ctx, t, 30*time.Second, "alice creates a ConfigMap", func() error {
		_, err := alice.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		return err
	})
	poll(ctx, t, 30*time.Second, "the audit event of alice's create", func() error {
		if !sink.find("create", "alice", "configmaps", name) {
			return fmt.Errorf("not among the events yet")
		}
		return nil
	})
}

func roleBinding(name, user string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
}
