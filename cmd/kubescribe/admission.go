package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// admissionWebhookConfig prints the ValidatingWebhookConfiguration for CommitRequests, for a
// URL or a Service, with the CA bundle that verifies kubescribe's serving certificate.
func admissionWebhookConfig(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("admission-webhook-config", flag.ContinueOnError)
	rawURL := fs.String("url", "", "kubescribe's admission endpoint, e.g. https://10.0.0.5:9443/validate/commitrequests")
	service := fs.String("service", "", "the Service in front of kubescribe, as namespace/name[:port] (port 9443 by default)")
	var caf caFlags
	caf.register(fs)
	tokenFile := fs.String("token-file", "", "kubescribe's --admission-token-file: the CommitRequest webhook's own token, derived from the first secret bound to --cluster-name, goes into the webhook's URL path, for an apiserver that presents no client certificate (a managed cluster); the attribution webhook refuses it")
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
	ca, err := caf.load(ctx)
	if err != nil {
		return err
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
	if err := addPathToken(&cc, *tokenFile, *clusterName, *clusterName, reviewhttp.WebhookCommitRequests); err != nil {
		return err
	}
	out, err := yaml.Marshal(authz.WebhookConfiguration(cc))
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// addPathToken puts webhook's own token, derived from the first secret of kubescribe's
// admission token file bound to route, into cc's path (a line without routes is bound to
// clusterName, kubescribe's --cluster-name); nothing without a file. The other webhook refuses
// that token, and the secret itself never goes into a URL. Errors name the file, never a token.
func addPathToken(cc *admissionregistrationv1.WebhookClientConfig, tokenFile, route, clusterName, webhook string) error {
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
	token := reviewhttp.PathTokenFor(tokens, route, webhook)
	if token == "" {
		return fmt.Errorf("admission token file %q: no token is bound to route %q", tokenFile, route)
	}
	reviewhttp.AddPathToken(cc, token)
	return nil
}

// admissionClientConfig prints the kubeconfig of the apiserver's AdmissionConfiguration
// (the ValidatingAdmissionWebhook plugin's kubeConfigFile): the credential the apiserver
// presents to kubescribe's admission webhooks, under the user named after the host and port
// it dials. A token is sent as a bearer token (never in a URL).
func admissionClientConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("admission-client-config", flag.ContinueOnError)
	host := fs.String("host", "kubescribe-admission.kubescribe.svc:9443", "the webhook's host:port as the apiserver dials it (a Service's <name>.<namespace>.svc:<port>)")
	tokenFile := fs.String("token-file", "", "kubescribe's --admission-token-file: the apiserver presents its first token bound to --cluster-name")
	clusterName := fs.String("cluster-name", "local", "kubescribe's --cluster-name")
	certFile := fs.String("client-cert", "", "PEM client certificate the apiserver presents, signed by kubescribe's --admission-client-ca-file")
	keyFile := fs.String("client-key", "", "PEM key of --client-cert")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if (*tokenFile == "") == (*certFile == "" && *keyFile == "") {
		return errors.New("exactly one of --token-file and --client-cert/--client-key is required")
	}
	user := &clientcmdapi.AuthInfo{}
	if *tokenFile != "" {
		if !audit.ValidRoute(*clusterName) {
			return fmt.Errorf("--cluster-name %q must be a DNS label", *clusterName)
		}
		tokens, err := audit.LoadTokenFile("admission token file", *tokenFile, *clusterName)
		if err != nil {
			return err
		}
		if user.Token = reviewhttp.TokenFor(tokens, *clusterName); user.Token == "" {
			return fmt.Errorf("admission token file %q: no token is bound to route %q", *tokenFile, *clusterName)
		}
	} else {
		var err error
		if user.ClientCertificateData, err = os.ReadFile(*certFile); err != nil {
			return fmt.Errorf("--client-cert: %w", err)
		}
		if user.ClientKeyData, err = os.ReadFile(*keyFile); err != nil {
			return fmt.Errorf("--client-key: %w", err)
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.AuthInfos[*host] = user
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}
