package app

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// ParseRouteNamespaces reads remote audit route bindings, each `<route>=<namespace>[,<namespace>...]`,
// into a map for Options.AuditRouteNamespaces. A route given twice is refused (give all its
// namespaces in one binding), as is an empty or malformed one. what names the flag in errors.
func ParseRouteNamespaces(what string, bindings []string) (map[string][]string, error) {
	if len(bindings) == 0 {
		return nil, nil
	}
	m := make(map[string][]string, len(bindings))
	for _, b := range bindings {
		route, list, ok := strings.Cut(b, "=")
		if !ok || route == "" || list == "" {
			return nil, fmt.Errorf("%s %q: want <route>=<namespace>[,<namespace>...]", what, b)
		}
		if _, dup := m[route]; dup {
			return nil, fmt.Errorf("%s: route %q is bound twice; give all its namespaces in one binding", what, route)
		}
		var namespaces []string
		for _, ns := range strings.Split(list, ",") {
			if !slices.Contains(namespaces, ns) {
				namespaces = append(namespaces, ns)
			}
		}
		m[route] = namespaces
	}
	return m, nil
}

// validateRouteNamespaces reports what is wrong with AuditRouteNamespaces: every route a DNS
// label other than ClusterName (the cluster kubescribe runs in is not a remote), every
// namespace a namespace name.
func (o *Options) validateRouteNamespaces(bad func(field, format string, args ...any)) {
	for route, namespaces := range o.AuditRouteNamespaces {
		switch {
		case !audit.ValidRoute(route):
			bad("AuditRouteNamespaces", "route %q must be a DNS label (lower-case letters, digits and '-')", route)
		case route == o.ClusterName:
			bad("AuditRouteNamespaces", "route %q is ClusterName, the cluster kubescribe runs in, which no GitTarget may name as a remote source cluster", route)
		case len(namespaces) == 0:
			bad("AuditRouteNamespaces", "route %q: want one or more namespaces", route)
		}
		for _, ns := range namespaces {
			if len(validation.IsDNS1123Label(ns)) > 0 {
				bad("AuditRouteNamespaces", "route %q: %q is not a namespace name", route, ns)
			}
		}
	}
}
