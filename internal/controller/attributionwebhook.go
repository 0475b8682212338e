package controller

import (
	"context"
	"log/slog"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// AttributionWebhookOptions make kubescribe manage the attribution
// ValidatingWebhookConfiguration (admission.WebhookConfigurationName) of the cluster it runs in:
// its rules follow the WatchRules and ClusterWatchRules in force.
type AttributionWebhookOptions struct {
	// ClientConfig is how the apiserver reaches POST /validate/attribution/<cluster>: a URL
	// or a Service (with its path), and the CA bundle.
	ClientConfig admissionregistrationv1.WebhookClientConfig
	// CABundle, when set, is the CA bundle in force, asked at each sync instead of
	// ClientConfig.CABundle: kubescribe's self-managed CA, which rotates.
	CABundle func() []byte
	// ExcludeNamespaces are never sent to the webhook (kube-system always is excluded):
	// kubescribe's own namespace belongs here.
	ExcludeNamespaces []string
	// Interval is how often the rules are compared with the streams in force; 0 means 5s.
	Interval time.Duration
	// Secrets covers the Secrets GitTargets encrypt: set when the webhook keeps keyed digests
	// of their writes (a digest key is configured). Without it they are never sent.
	Secrets bool
	// SecretsOnly leaves every other resource out: set when the cluster's authors come from
	// audit events (--attribution-source=audit), which credit everything but the creates and
	// updates of Secrets kept at the Metadata level. The apiserver then calls the webhook for
	// Secrets' writes only.
	SecretsOnly bool
}

// attributionWebhookSync keeps the webhook configuration's rules equal to the resources and
// operations watched in the local cluster: only the watched resources (and their scale
// subresource) and operations reach the webhook, and only from the watched namespaces unless a
// stream watches every namespace (or more than maxWebhookNamespaces are watched). With nothing
// watched the configuration is deleted, so no write waits for a webhook nobody needs.
type attributionWebhookSync struct {
	kube    kubernetes.Interface
	opts    AttributionWebhookOptions
	streams func() []watch.StreamSpec
	// leads reports whether this replica runs the singletons: only the leader writes the
	// configuration.
	leads func() bool
	log   *slog.Logger
}

// run syncs until ctx ends.
func (w *attributionWebhookSync) run(ctx context.Context) {
	interval := w.opts.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	// The first sync waits one interval, so the rules are reconciled into streams first: a
	// sync at start would find nothing watched and delete the configuration.
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.leads != nil && !w.leads() {
			continue
		}
		if err := w.sync(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("cannot update the attribution webhook configuration; writes keep flowing (failurePolicy Ignore), new resources may go unattributed", "err", err)
		}
	}
}

// desired is the configuration for the streams in force, nil when nothing is watched.
func (w *attributionWebhookSync) desired() *admissionregistrationv1.ValidatingWebhookConfiguration {
	type gr struct{ group, resource string }
	ops := map[gr][]string{}
	all := map[gr]bool{}
	var namespaces []string
	everyNamespace := false
	for _, s := range w.streams() {
		if w.opts.SecretsOnly && !watch.IsSecret(s.GVR) {
			continue
		}
		if s.Namespace == "" {
			everyNamespace = true // a cluster-wide stream (or a cluster-scoped resource)
		} else if !slices.Contains(namespaces, s.Namespace) {
			namespaces = append(namespaces, s.Namespace)
		}
		k := gr{s.GVR.Group, s.GVR.Resource}
		if len(s.Operations) == 0 {
			all[k] = true
		}
		for _, op := range s.Operations {
			o := opOf(op)
			if o != "" && !slices.Contains(ops[k], o) {
				ops[k] = append(ops[k], o)
			}
		}
		if _, ok := ops[k]; !ok {
			ops[k] = nil
		}
	}
	resources := make([]admission.Resource, 0, len(ops))
	for k, o := range ops {
		if all[k] {
			o = nil // every operation
		}
		resources = append(resources, admission.Resource{Group: k.group, Resource: k.resource, Operations: o, Scale: true})
	}
	cc := w.opts.ClientConfig
	if w.opts.CABundle != nil {
		if b := w.opts.CABundle(); len(b) > 0 {
			cc.CABundle = b
		}
	}
	if everyNamespace || len(namespaces) > maxWebhookNamespaces {
		namespaces = nil
	}
	return admission.WebhookConfiguration(admission.WebhookOptions{
		ClientConfig: cc, Resources: resources, ExcludeNamespaces: w.opts.ExcludeNamespaces, Namespaces: namespaces,
	})
}

// maxWebhookNamespaces bounds the namespaces the webhook's selector names one by one; past it
// the webhook takes every namespace but the excluded ones (a configuration naming thousands
// would be rewritten at every namespace a ClusterWatchRule's selector gains).
const maxWebhookNamespaces = 256

func opOf(op watch.Op) string {
	switch op {
	case watch.OpCreate:
		return admission.OpCreate
	case watch.OpUpdate:
		return admission.OpUpdate
	case watch.OpDelete:
		return admission.OpDelete
	}
	return ""
}

func (w *attributionWebhookSync) sync(ctx context.Context) error {
	client := w.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	want := w.desired()
	have, err := client.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if want == nil {
			return nil
		}
		_, err = client.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
		if err == nil {
			w.log.Info("attribution webhook configuration created", "rules", len(want.Webhooks[0].Rules))
		}
		return err
	case err != nil:
		return err
	case want == nil:
		err = client.Delete(ctx, admission.WebhookConfigurationName, metav1.DeleteOptions{})
		if err == nil {
			w.log.Info("attribution webhook configuration deleted: nothing is watched")
		}
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if len(have.Webhooks) == 1 && sameWebhook(&have.Webhooks[0], &want.Webhooks[0]) {
		return nil
	}
	want.ResourceVersion = have.ResourceVersion
	_, err = client.Update(ctx, want, metav1.UpdateOptions{FieldManager: FieldManager})
	if err == nil {
		w.log.Info("attribution webhook configuration updated", "rules", len(want.Webhooks[0].Rules))
	}
	return err
}

// sameWebhook compares the fields kubescribe sets; the apiserver defaults others (an empty
// objectSelector, the Service port), which must not make every sync an update.
func sameWebhook(have, want *admissionregistrationv1.ValidatingWebhook) bool {
	hc, wc := have.ClientConfig, want.ClientConfig
	sameService := (hc.Service == nil) == (wc.Service == nil)
	if sameService && wc.Service != nil {
		sameService = hc.Service.Namespace == wc.Service.Namespace && hc.Service.Name == wc.Service.Name &&
			equality.Semantic.DeepEqual(hc.Service.Path, wc.Service.Path) &&
			(wc.Service.Port == nil || equality.Semantic.DeepEqual(hc.Service.Port, wc.Service.Port))
	}
	return have.Name == want.Name && sameService &&
		equality.Semantic.DeepEqual(hc.URL, wc.URL) && equality.Semantic.DeepEqual(hc.CABundle, wc.CABundle) &&
		equality.Semantic.DeepEqual(have.Rules, want.Rules) &&
		equality.Semantic.DeepEqual(have.NamespaceSelector, want.NamespaceSelector) &&
		equality.Semantic.DeepEqual(have.FailurePolicy, want.FailurePolicy) &&
		equality.Semantic.DeepEqual(have.MatchPolicy, want.MatchPolicy) &&
		equality.Semantic.DeepEqual(have.SideEffects, want.SideEffects) &&
		equality.Semantic.DeepEqual(have.TimeoutSeconds, want.TimeoutSeconds)
}

func (c *Controller) attributionWebhook() *attributionWebhookSync {
	return &attributionWebhookSync{
		kube: c.opts.Kube, opts: *c.opts.AttributionWebhook, log: c.log.With("webhook", admission.WebhookConfigurationName),
		leads: c.leads,
		// Every rule's streams, not only this replica's: the leader writes the configuration
		// for all of them.
		streams: c.wantedStreams,
	}
}
