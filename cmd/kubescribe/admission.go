package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/authz"
)

// admissionWebhookConfig prints the ValidatingWebhookConfiguration for CommitRequests, for a
// URL or a Service, with the CA bundle that verifies kubescribe's serving certificate.
func admissionWebhookConfig(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("admission-webhook-config", flag.ContinueOnError)
	rawURL := fs.String("url", "", "kubescribe's admission endpoint, e.g. https://10.0.0.5:9443/validate/commitrequests")
	service := fs.String("service", "", "the Service in front of kubescribe, as namespace/name[:port] (port 9443 by default)")
	caFile := fs.String("ca-file", "", "PEM CA bundle that signed kubescribe's serving certificate")
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
		u, err := url.Parse(*rawURL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return errors.New("--url must be an https URL with a host, without user info, query or fragment")
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = authz.Path
		}
		s := u.String()
		cc.URL = &s
	} else {
		ref, err := parseService(*service)
		if err != nil {
			return err
		}
		cc.Service = ref
	}
	out, err := yaml.Marshal(authz.WebhookConfiguration(cc))
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

func parseService(s string) (*admissionregistrationv1.ServiceReference, error) {
	port := int32(9443)
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("--service %q: the port must be a number from 1 to 65535", s)
		}
		port, s = int32(p), s[:i]
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--service %q: want namespace/name[:port]", s)
	}
	path := authz.Path
	return &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Path: &path, Port: &port}, nil
}
