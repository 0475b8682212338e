package authz

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// WebhookConfigurationName is the name of the ValidatingWebhookConfiguration.
const WebhookConfigurationName = "kubescribe-commitrequests"

// webhookTimeoutSeconds keeps a slow kubescribe from holding up creates: past it, the apiserver
// admits the request (failurePolicy Ignore) and the controller ignores any spec.author.
const webhookTimeoutSeconds = 5

// WebhookConfiguration returns the ValidatingWebhookConfiguration that sends CommitRequest
// creates to kubescribe, reached through cc (a URL or a Service, and the CA bundle). It matches
// CREATE of commitrequests only, fails open (the controller is the real gate) and declares no
// side effects on dry run (a dry run records nothing).
func WebhookConfiguration(cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.ValidatingWebhookConfiguration {
	ignore := admissionregistrationv1.Ignore
	sideEffects := admissionregistrationv1.SideEffectClassNoneOnDryRun
	equivalent := admissionregistrationv1.Equivalent
	scope := admissionregistrationv1.NamespacedScope
	timeout := int32(webhookTimeoutSeconds)
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   WebhookConfigurationName,
			Labels: map[string]string{"app.kubernetes.io/name": "kubescribe"},
		},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "commitrequests.kubescribe.dev",
			ClientConfig: cc,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{v1alpha1.GroupName},
					APIVersions: []string{v1alpha1.SchemeGroupVersion.Version},
					Resources:   []string{"commitrequests"},
					Scope:       &scope,
				},
			}},
			FailurePolicy:           &ignore,
			MatchPolicy:             &equivalent,
			SideEffects:             &sideEffects,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}
