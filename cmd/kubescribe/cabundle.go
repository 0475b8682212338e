package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"

	"github.com/kubescribe/kubescribe/internal/selftls"
)

// caFlags are the two ways a command learns the CA bundle the apiserver verifies kubescribe's
// serving certificate with: a file, or kubescribe's self-managed TLS Secret, read through the
// user's kubeconfig.
type caFlags struct {
	file, secret, kubeconfig, context string
}

func (c *caFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.file, "ca-file", "", "PEM CA bundle that signed kubescribe's serving certificate")
	fs.StringVar(&c.secret, "ca-from-secret", "", "namespace/name of the Secret of kubescribe's certificate, e.g. kubescribe/kubescribe-tls (its self-managed TLS Secret, or cert-manager's): take the CA bundle (ca.crt) from it, read with --kubeconfig")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig for --ca-from-secret (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&c.context, "context", "", "kubeconfig context for --ca-from-secret (default: the current context)")
}

// load reads the CA bundle from where the flags say.
func (c *caFlags) load(ctx context.Context) ([]byte, error) {
	switch {
	case c.file != "" && c.secret != "":
		return nil, errors.New("--ca-file and --ca-from-secret are exclusive")
	case c.file != "":
		ca, err := os.ReadFile(c.file)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(string(ca), "-----BEGIN CERTIFICATE-----") {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", c.file)
		}
		return ca, nil
	case c.secret != "":
		return c.fromSecret(ctx)
	}
	return nil, errors.New("--ca-file or --ca-from-secret is required: the apiserver must verify kubescribe's certificate")
}

// fromSecret reads the Secret of kubescribe's certificate with the user's kubeconfig (which
// needs get on it) and returns its CA bundle: a self-managed TLS Secret, or a kubernetes.io/tls
// Secret with a ca.crt (cert-manager's). Nothing else of it leaves this function.
func (c *caFlags) fromSecret(ctx context.Context) ([]byte, error) {
	namespace, name, ok := strings.Cut(c.secret, "/")
	if !ok || namespace == "" || name == "" {
		return nil, fmt.Errorf("--ca-from-secret %q: want <namespace>/<name>", c.secret)
	}
	cfg, _, err := restConfig(&exportOptions{kubeconfig: c.kubeconfig, context: c.context, qps: 5, burst: 10})
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "kubescribe-cli"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s, err := kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("--ca-from-secret: %w", err)
	}
	if s.Type == corev1.SecretTypeTLS {
		if _, err := cert.ParseCertsPEM(s.Data[selftls.KeyCABundle]); err != nil {
			return nil, fmt.Errorf("--ca-from-secret: the Secret %s/%s has no CA certificate in ca.crt: %w", namespace, name, err)
		}
		return s.Data[selftls.KeyCABundle], nil
	}
	return selftls.CAFromSecret(s)
}
