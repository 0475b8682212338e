package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// admissionWebhookConfig prints the ValidatingWebhookConfiguration for CommitRequests, for a
// URL or a Service, with the CA bundle that verifies kubescribe's serving certificate.
func admissionWebhookConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("admission-webhook-config", flag.ContinueOnError)
	rawURL := fs.String("url", "", "kubescribe's admission endpoint, e.g. https://10.0.0.5:9443/validate/commitrequests")
	service := fs.String("service", "", "the Service in front of kubescribe, as namespace/name[:port] (port 9443 by default)")
	caFile := fs.String("ca-file", "", "PEM CA bundle that signed kubescribe's serving certificate")
	tokenFile := fs.String("token-file", "", "kubescribe's --admission-token-file: the first token bound to --cluster-name goes into the webhook's URL path, for an apiserver that presents no client certificate (a managed cluster)")
	clusterName := fs.String("cluster-name", "local", "kubescribe's --cluster-name: the CommitRequest webhook serves that route only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if (*rawURL == "") == (*service == "") {
		return errors.New("exactly one of --url and --service is required")
	}
	if *caFile == "" {
		return errors.New("--ca-file is required: the apiserver must verify kubescribe's certificate")
	}
	ca, err := os.ReadFile(*caFile)
	if err != nil {
		return err
	}
	if !strings.Contains(string(ca), "-----BEGIN CERTIFICATE-----") {
		return fmt.Errorf("--ca-file %s holds no PEM certificate", *caFile)
	}
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: ca}
	if *rawURL != "" {
		u, ok := admission.WebhookURL(*rawURL, authz.Path)
		if !ok {
			return errors.New("--url must be an https URL with a host, without user info, query or fragment")
		}
		cc.URL = &u
	} else {
		ref, err := admission.ServiceReference(*service, authz.Path)
		if err != nil {
			return fmt.Errorf("--service %q: %w", *service, err)
		}
		cc.Service = ref
	}
	if err := addPathToken(&cc, *tokenFile, *clusterName, *clusterName); err != nil {
		return err
	}
	out, err := yaml.Marshal(authz.WebhookConfiguration(cc))
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// addPathToken puts the first token of kubescribe's admission token file bound to route into
// cc's path (a line without routes is bound to clusterName, kubescribe's --cluster-name);
// nothing without a file. Errors name the file, never a token.
func addPathToken(cc *admissionregistrationv1.WebhookClientConfig, tokenFile, route, clusterName string) error {
	if tokenFile == "" {
		return nil
	}
	if !audit.ValidRoute(route) || !audit.ValidRoute(clusterName) {
		return fmt.Errorf("the route %q and --cluster-name %q must be DNS labels", route, clusterName)
	}
	tokens, err := audit.LoadTokenFile("admission token file", tokenFile, clusterName)
	if err != nil {
		return err
	}
	if err := reviewhttp.ValidatePathTokens(tokenFile, tokens); err != nil {
		return err
	}
	token := reviewhttp.TokenFor(tokens, route)
	if token == "" {
		return fmt.Errorf("admission token file %q: no token is bound to route %q", tokenFile, route)
	}
	reviewhttp.AddPathToken(cc, token)
	return nil
}
