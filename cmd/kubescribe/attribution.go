package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// attributionWebhookConfig prints the attribution ValidatingWebhookConfiguration, for users
// who manage it themselves (kubescribe manages it when started with
// --attribution-webhook-url or --attribution-webhook-service).
func attributionWebhookConfig(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("attribution-webhook-config", flag.ContinueOnError)
	rawURL := fs.String("url", "", "kubescribe's admission endpoint, e.g. https://10.0.0.5:9443 (the path /validate/attribution/<route> is added when none is given)")
	service := fs.String("service", "", "the Service in front of kubescribe, as namespace/name[:port] (port 9443 by default)")
	var caf caFlags
	caf.register(fs)
	route := fs.String("route", "local", "the cluster's name in kubescribe (its --cluster-name)")
	tokenFile := fs.String("token-file", "", "kubescribe's --admission-token-file: the attribution webhook's own token, derived from the first secret bound to --route, goes into the webhook's URL path, for an apiserver that presents no client certificate (a managed cluster); the CommitRequest webhook refuses it")
	clusterName := fs.String("cluster-name", "local", "kubescribe's --cluster-name: the route of the token-file lines without routes")
	var resources, exclude, namespaces listFlag
	fs.Var(&resources, "resource", "a watched resource, [group/]resource[:OP,OP] with OP one of CREATE, UPDATE, DELETE (all by default); repeat it")
	fs.Var(&exclude, "exclude-namespace", "a namespace never sent to the webhook besides kube-system (default: kubescribe); repeat it")
	fs.Var(&namespaces, "namespace", "a watched namespace: only the writes of these are sent (default: every namespace but the excluded ones); repeat it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if !audit.ValidRoute(*route) {
		return fmt.Errorf("--route %q must be a DNS label", *route)
	}
	if len(resources) == 0 {
		return errors.New("at least one --resource is required: the webhook sees only the watched resources")
	}
	ca, err := caf.load(ctx)
	if err != nil {
		return err
	}
	cc, err := admission.ClientConfig(*rawURL, *service, ca, *route)
	if err != nil {
		return err
	}
	if err := addPathToken(&cc, *tokenFile, *route, *clusterName, reviewhttp.WebhookAttribution); err != nil {
		return err
	}
	var rs []admission.Resource
	for _, r := range resources {
		res, err := parseResource(r)
		if err != nil {
			return err
		}
		rs = append(rs, res)
	}
	if len(exclude) == 0 {
		exclude = listFlag{"kubescribe"}
	}
	for _, ns := range namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("--namespace %q: %s", ns, strings.Join(errs, "; "))
		}
	}
	config := admission.WebhookConfiguration(admission.WebhookOptions{ClientConfig: cc, Resources: rs, ExcludeNamespaces: exclude, Namespaces: namespaces})
	if config == nil {
		return fmt.Errorf("every --namespace is excluded (kube-system, %s): the webhook would be sent nothing", strings.Join(exclude, ", "))
	}
	out, err := yaml.Marshal(config)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// parseResource reads [group/]resource[:OP,OP].
func parseResource(s string) (admission.Resource, error) {
	spec, ops, hasOps := strings.Cut(s, ":")
	group, resource, ok := strings.Cut(spec, "/")
	if !ok {
		group, resource = "", spec
	}
	if resource == "" || strings.Contains(resource, "/") {
		return admission.Resource{}, fmt.Errorf("--resource %q: want [group/]resource[:OP,OP]", s)
	}
	r := admission.Resource{Group: group, Resource: resource, Scale: true}
	if hasOps {
		for _, op := range strings.Split(ops, ",") {
			op = strings.ToUpper(strings.TrimSpace(op))
			if op != admission.OpCreate && op != admission.OpUpdate && op != admission.OpDelete {
				return admission.Resource{}, fmt.Errorf("--resource %q: operation %q is not one of CREATE, UPDATE, DELETE", s, op)
			}
			r.Operations = append(r.Operations, op)
		}
	}
	return r, nil
}
