package stack

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// MetricsReader is the ServiceAccount (namespace kubescribe) the stack binds to deploy/base/
// rbac.yaml's ClusterRole kubescribe-metrics-reader, as an operator binds Prometheus';
// Stack.MetricsToken is one of its tokens.
const MetricsReader = "kubescribe-e2e-prometheus"

// GetMetrics reads MetricsURL as Prometheus does, over TLS verified with the control plane's
// CA, with token as its bearer token ("" for none). It returns the status code and the body.
func (s *Stack) GetMetrics(token string) (int, []byte, error) {
	return s.getMetrics(s.MetricsURL, token)
}

// getMetrics reads the /metrics at url (a replica's) as GetMetrics does.
func (s *Stack) getMetrics(url, token string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.metricsClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// ScrapeMetrics reads kubescribe's /metrics with MetricsToken into its samples, by their whole
// name: "name" or "name{labels}". Comments, and samples that are not a number (NaN), are left
// out.
func (s *Stack) ScrapeMetrics() (map[string]float64, error) { return s.scrapeMetrics(s.MetricsURL) }

func (s *Stack) scrapeMetrics(url string) (map[string]float64, error) {
	code, b, err := s.getMetrics(url, s.MetricsToken)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d: %s", url, code, bytes.TrimSpace(b))
	}
	return ParseMetrics(b), nil
}

// grantMetricsReader creates the ServiceAccount MetricsReader, binds it to
// kubescribe-metrics-reader and returns a token the apiserver issued for it (TokenRequest),
// valid for a day.
func grantMetricsReader(ctx context.Context, kube kubernetes.Interface) (string, error) {
	const ns = "kubescribe"
	_, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: MetricsReader}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	_, err = kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: MetricsReader},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kubescribe-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: MetricsReader}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	expiry := int64(24 * time.Hour / time.Second)
	tok, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, MetricsReader,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for ServiceAccount %s/%s: %w", ns, MetricsReader, err)
	}
	return tok.Status.Token, nil
}

// newMetricsClient is an HTTP client that verifies kubescribe's serving certificate with the
// control plane's CA.
func newMetricsClient(caPEM []byte) (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the control plane's CA holds no certificate")
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}, nil
}

// ParseMetrics reads a page in Prometheus' text format (kubescribe's or an apiserver's) into
// its samples, as Stack.ScrapeMetrics does.
func ParseMetrics(b []byte) map[string]float64 {
	m := map[string]float64{}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		i := bytes.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(string(line[i+1:]), 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		m[string(line[:i])] = v
	}
	return m
}
