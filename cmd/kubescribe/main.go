// Command kubescribe is the command-line companion of the kubescribe service:
//
//	kubescribe audit-policy                 the --audit-policy-file content
//	kubescribe audit-webhook-config [flags] the --audit-webhook-config-file content
//	kubescribe admission-client-config      the apiserver's admission webhook credential (kubeconfig)
//	kubescribe admission-webhook-config     the CommitRequest ValidatingWebhookConfiguration
//	kubescribe attribution-webhook-config   the attribution ValidatingWebhookConfiguration (managed clusters)
//	kubescribe scan [--repo] DIR            may this folder become a GitTarget (pkg/manifestanalyzer)
//	kubescribe export [flags] DIR           write a live cluster's declared objects into DIR
//	kubescribe rbac [flags]                 the least-privilege RBAC for the rules present
//	kubescribe doctor [flags]               what is wrong with an installation, check by check
//
// docs/cli.md describes every command, flag and exit code.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage:
  kubescribe audit-policy
      print the audit policy for the apiserver's --audit-policy-file
  kubescribe audit-webhook-config --url URL (--ca-file FILE | --ca-from-secret NS/NAME [--kubeconfig FILE])
                    [--tls-server-name NAME] (--token-file FILE | --client-cert FILE --client-key FILE)
      print the kubeconfig for the apiserver's --audit-webhook-config-file
  kubescribe admission-client-config [--host HOST:PORT] (--token-file FILE | --client-cert FILE --client-key FILE)
      print the kubeconfig of the apiserver's AdmissionConfiguration: its credential for kubescribe
  kubescribe admission-webhook-config (--url URL | --service NS/NAME[:PORT]) (--ca-file FILE | --ca-from-secret NS/NAME)
      print the ValidatingWebhookConfiguration for CommitRequests (kubectl apply -f -)
  kubescribe attribution-webhook-config (--url URL | --service NS/NAME[:PORT]) (--ca-file FILE | --ca-from-secret NS/NAME)
                    --resource [GROUP/]RESOURCE[:OP,..] ... [--route NAME] [--exclude-namespace NS ...]
      print the attribution ValidatingWebhookConfiguration for clusters without audit access
  kubescribe scan [--repo] [--format text|json|yaml] DIR
      may folder DIR become a GitTarget (with --repo: which folders of repository DIR could);
      exit code 0 yes, 1 no, 2 error
  kubescribe export [--kubeconfig FILE] [--context NAME] [--api-groups G,..] [--resources R,..]
                    [--namespaces NS,..] [--commit [--author "N <e>"] [--message M]] DIR
      write the declared form of a cluster's objects into DIR, in the writer's layout
  kubescribe rbac [--kubeconfig FILE] [--context NAME] [-f FILE|DIR|- ...] [--source-cluster ROUTE]
                  [--service-account NS/NAME | --user NAME | --group NAME ...] [--name NAME]
      print the least-privilege ClusterRole, Roles and bindings the WatchRules, ClusterWatchRules,
      GitProviders and GitTargets present need (kubectl apply -f -)
  kubescribe doctor [--kubeconfig FILE] [--context NAME] [-n NS] [--format text|json] [flags]
      check an installation: kubescribe and Redis, audit delivery and routes, RBAC, rules, Git;
      exit code 0 nothing failed, 1 a check failed, 2 error (docs/cli.md#kubescribe-doctor)
`

func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "scan":
		return scanCmd(ctx, args[1:], stdout, stderr)
	case "export":
		return exportCmd(ctx, args[1:], stdout, stderr)
	case "rbac":
		return rbacCmd(ctx, args[1:], stdout, stderr)
	case "doctor":
		return doctorCmd(ctx, args[1:], stdout, stderr)

	case "audit-policy":
		_, err = stdout.Write(audit.Policy())
	case "audit-webhook-config":
		err = webhookConfig(ctx, args[1:], stdout)
	case "admission-webhook-config":
		err = admissionWebhookConfig(ctx, args[1:], stdout)
	case "attribution-webhook-config":
		err = attributionWebhookConfig(ctx, args[1:], stdout)
	case "admission-client-config":
		err = admissionClientConfig(args[1:], stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("unknown command %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(stderr, "kubescribe:", err)
		if errors.Is(err, flag.ErrHelp) || strings.HasPrefix(err.Error(), "unknown command") {
			fmt.Fprint(stderr, usage)
		}
		return 1
	}
	return 0
}

func webhookConfig(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("audit-webhook-config", flag.ContinueOnError)
	url := fs.String("url", "", "kubescribe's audit endpoint, e.g. https://kubescribe-audit.kubescribe.svc:8443/audit/local")
	var ca caFlags
	ca.register(fs)
	serverName := fs.String("tls-server-name", "", "the name the apiserver verifies kubescribe's certificate for, when the URL's host is not one of its names (an IP such as the Service's ClusterIP), e.g. kubescribe-audit.kubescribe.svc")
	tokenFile := fs.String("token-file", "", "kubescribe's --audit-token-file: the apiserver presents its first token bound to the URL's route")
	clusterName := fs.String("cluster-name", "local", "kubescribe's --cluster-name: the route of the token-file lines without routes")
	certFile := fs.String("client-cert", "", "PEM client certificate the apiserver presents")
	keyFile := fs.String("client-key", "", "PEM key of --client-cert")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	c := audit.WebhookConfig{URL: *url, TLSServerName: *serverName}
	var err error
	if c.CAData, err = ca.load(ctx); err != nil {
		return err
	}
	if *tokenFile != "" {
		// The route is the URL's last segment (/audit/<route>); the token must be bound to it.
		route := (*url)[strings.LastIndexByte(*url, '/')+1:]
		if !audit.ValidRoute(route) || !audit.ValidRoute(*clusterName) {
			return fmt.Errorf("--url must end in /audit/<route> and --cluster-name must be a DNS label to pick a token of --token-file")
		}
		tokens, err := audit.LoadTokenFile("audit token file", *tokenFile, *clusterName)
		if err != nil {
			return err
		}
		if c.Token = reviewhttp.TokenFor(tokens, route); c.Token == "" {
			return fmt.Errorf("audit token file %q: no token is bound to route %q", *tokenFile, route)
		}
	}
	if *certFile != "" || *keyFile != "" {
		if c.ClientCertData, err = os.ReadFile(*certFile); err != nil {
			return fmt.Errorf("--client-cert: %w", err)
		}
		if c.ClientKeyData, err = os.ReadFile(*keyFile); err != nil {
			return fmt.Errorf("--client-key: %w", err)
		}
	}
	out, err := audit.WebhookKubeconfig(c)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}
