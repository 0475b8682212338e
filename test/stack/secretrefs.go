package stack

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// WaitSecretRefsWebhook waits until the apiserver calls kubescribe's webhook of Secret
// references: a dry-run create of a GitProvider naming a Secret, as the admin, reaches
// kubescribe's admission listener (its count of answered reviews grows). Until then a
// GitProvider or GitTarget naming a Secret would be created without the record that lets
// kubescribe use the Secret (SecretReferenceUnverified).
func (s *Stack) WaitSecretRefsWebhook(ctx context.Context) error {
	const served = `kubescribe_authz_requests_total{code="200"}`
	dyn, err := dynamic.NewForConfig(s.AdminConfig)
	if err != nil {
		return err
	}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubescribe.dev/v1alpha1", "kind": "GitProvider",
		"metadata": map[string]any{"name": "stack-webhook-probe", "namespace": "default"},
		"spec":     map[string]any{"url": "https://git.example.invalid/probe.git", "secretRef": map[string]any{"name": "probe"}},
	}}
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for {
		before, err := s.ScrapeMetrics()
		if err == nil {
			_, last = dyn.Resource(v1alpha1.GitProvidersResource).Namespace("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			after, err := s.ScrapeMetrics()
			if last == nil && err == nil && after[served] > before[served] {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the apiserver did not call the webhook of Secret references within 60s (last create: %v)", last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
