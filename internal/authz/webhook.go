package authz

import (
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// WebhookConfigurationName is the name of the ValidatingWebhookConfiguration.
const WebhookConfigurationName = "kubescribe-commitrequests"

// webhookTimeoutSeconds keeps a slow kubescribe from holding up creates for long.
const webhookTimeoutSeconds = 5

// Names of the webhook configuration's two entries, and the CEL conditions that split
// CommitRequest creates between them.
const (
	// SubmitterWebhookName sees creates without spec.author: it records who submitted them,
	// and fails open.
	SubmitterWebhookName = "commitrequests.kubescribe.dev"
	// AuthorWebhookName sees creates that assert an author: it checks assert-author, and
	// fails closed.
	AuthorWebhookName = "authors.commitrequests.kubescribe.dev"

	// SecretRefsWebhookName sees creates and updates of GitProviders and GitTargets: it checks
	// that the requester may read the Secrets they name, and fails open (the controller uses
	// the Secrets only of a spec with a recorded verdict).
	SecretRefsWebhookName = "secretrefs.kubescribe.dev"

	assertsAuthor     = "has(object.spec) && has(object.spec.author)"
	assertsNoAuthor   = "!has(object.spec) || !has(object.spec.author)"
	matchAuthorName   = "asserts-author"
	matchNoAuthorName = "asserts-no-author"
)

// WebhookConfiguration returns the ValidatingWebhookConfiguration that sends CommitRequest
// creates to kubescribe, reached through cc (a URL or a Service, and the CA bundle). Two
// entries split the creates with matchConditions: one without spec.author fails open
// (failurePolicy Ignore: kubescribe down never blocks a plain CommitRequest, which then closes
// no window), one with spec.author fails closed (failurePolicy Fail: an assertion kubescribe
// cannot check is refused at once, instead of being admitted and then ignored by the
// controller; see docs/security.md). Both match CREATE of commitrequests only and declare no
// side effects on dry run (a dry run records nothing). A third entry sends creates and updates
// of GitProviders and GitTargets to SecretRefsPath (cc's path with Path replaced by it, a token
// suffix kept), failing open: see secretrefs.go.
func WebhookConfiguration(cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.ValidatingWebhookConfiguration {
	entry := func(name string, policy admissionregistrationv1.FailurePolicyType, condName, cond string) admissionregistrationv1.ValidatingWebhook {
		sideEffects := admissionregistrationv1.SideEffectClassNoneOnDryRun
		equivalent := admissionregistrationv1.Equivalent
		scope := admissionregistrationv1.NamespacedScope
		timeout := int32(webhookTimeoutSeconds)
		return admissionregistrationv1.ValidatingWebhook{
			Name:         name,
			ClientConfig: *cc.DeepCopy(),
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{v1alpha1.GroupName},
					APIVersions: []string{v1alpha1.SchemeGroupVersion.Version},
					Resources:   []string{"commitrequests"},
					Scope:       &scope,
				},
			}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: condName, Expression: cond}},
			FailurePolicy:           &policy,
			MatchPolicy:             &equivalent,
			SideEffects:             &sideEffects,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   WebhookConfigurationName,
			Labels: map[string]string{"app.kubernetes.io/name": "kubescribe"},
		},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			entry(SubmitterWebhookName, admissionregistrationv1.Ignore, matchNoAuthorName, assertsNoAuthor),
			entry(AuthorWebhookName, admissionregistrationv1.Fail, matchAuthorName, assertsAuthor),
			secretRefsEntry(entry(SecretRefsWebhookName, admissionregistrationv1.Ignore, "", "")),
		},
	}
}

// secretRefsEntry turns an entry of the CommitRequest webhook into the one of Secret
// references: GitProviders and GitTargets, created or updated, at SecretRefsPath.
func secretRefsEntry(w admissionregistrationv1.ValidatingWebhook) admissionregistrationv1.ValidatingWebhook {
	w.MatchConditions = nil
	w.Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	w.Rules[0].Resources = []string{"gitproviders", "gittargets"}
	repath := func(p string) string { return strings.Replace(p, Path, SecretRefsPath, 1) }
	if w.ClientConfig.URL != nil {
		u := repath(*w.ClientConfig.URL)
		w.ClientConfig.URL = &u
	}
	if s := w.ClientConfig.Service; s != nil && s.Path != nil {
		p := repath(*s.Path)
		s.Path = &p
	}
	return w
}
