// Package repoid says which repository a Git URL names: one canonical identity for every
// spelling of one repository on one server. kubescribe compares repositories with it (two
// GitTargets of two GitProviders may not claim overlapping folders of one repository branch) and
// never with the URLs as written: https://host:443//org/repo/?x, ssh://git@host/org/repo.git
// and git@host:org/repo are one repository.
//
// The identity is "the same repository on the same server": the host (lower case, without a
// trailing dot, an IP address in its shortest form) and the repository's path. Neither the
// scheme, the user nor the port counts: a server serves one repository over HTTPS and SSH (often
// on other ports than 443 and 22), so these spellings are one repository for any check that
// keeps two writers apart. Counting them the other way would let a GitProvider name a tenant's
// repository in another way, and write over its folder. The cost of the choice is a false match:
// two servers on one host name, on two ports, with one repository path, count as one, and their
// GitTargets must keep their folders apart as if they shared a repository.
//
// The URL as given stays what kubescribe dials; the identity is only ever compared.
package repoid

import (
	"cmp"
	"net"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
)

// ID is a repository's identity: "<host>/<path>" for a network URL, "file://<path>" for a local
// one, the path in lower case. The zero ID is that of no repository URL.
type ID string

// defaultPorts are the ports a scheme dials when a URL names none.
var defaultPorts = map[string]string{"https": "443", "http": "80", "ssh": "22", "git": "9418"}

// Canonical returns the canonical form of a repository URL: scheme and host in lower case, a
// scp-like user@host:path as ssh://user@host/path, the scheme's default port dropped, repeated
// slashes collapsed, "." and ".." resolved, and the query, the fragment, a trailing "/" and a
// ".git" suffix dropped. A password is dropped; the user is kept (ssh://git@host/org/repo). ok is
// false for what is not a repository URL (no scheme, no host or one that is neither a name nor an
// address, a scheme other than https, http, ssh, git or file, a control character); Canonical
// never panics.
func Canonical(raw string) (canonical string, ok bool) {
	p, ok := parse(raw)
	if !ok {
		return "", false
	}
	u := url.URL{Scheme: p.scheme, Path: p.path}
	if p.scheme != "file" {
		u.Host = p.host
		if strings.Contains(u.Host, ":") {
			u.Host = "[" + u.Host + "]"
		}
		if p.port != "" && p.port != defaultPorts[p.scheme] {
			u.Host += ":" + p.port
		}
		if p.user != "" {
			u.User = url.User(p.user)
		}
	}
	return u.String(), true
}

// Of returns the identity of the repository raw names, or the zero ID when raw is not a
// repository URL (Canonical).
func Of(raw string) ID {
	p, ok := parse(raw)
	if !ok {
		return ""
	}
	if p.scheme == "file" {
		return ID("file://" + strings.ToLower(p.path))
	}
	return ID(p.host + strings.ToLower(p.path))
}

// Same reports whether a and b name the same repository on the same server. When either is not a
// repository URL Of understands, they are compared as written, ignoring case, surrounding spaces
// and a trailing "/" or ".git": never less than the same repository spelled the same way.
func Same(a, b string) bool {
	ia, ib := Of(a), Of(b)
	if ia != "" && ib != "" {
		return ia == ib
	}
	la, lb := asWritten(a), asWritten(b)
	return la != "" && la == lb
}

// asWritten is a URL Of does not understand, as Same compares it.
func asWritten(s string) string {
	s = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), "/")
	return strings.TrimSuffix(s, ".git")
}

// parsed is a repository URL taken apart.
type parsed struct {
	scheme, user, host, port, path string
}

// parse takes a repository URL apart and canonicalizes each part.
func parse(raw string) (parsed, bool) {
	raw = strings.TrimSpace(raw)
	if raw == "" || strings.ContainsFunc(raw, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return parsed{}, false
	}
	if !strings.Contains(raw, "://") {
		s, ok := scpLike(raw)
		if !ok {
			return parsed{}, false
		}
		raw = s
	}
	u, err := url.Parse(raw)
	if err != nil {
		return parsed{}, false
	}
	p := parsed{scheme: strings.ToLower(u.Scheme), path: cleanPath(u.Path)}
	switch p.scheme {
	case "file":
		if u.Host != "" && !strings.EqualFold(u.Host, "localhost") {
			return parsed{}, false // a file URL of another machine
		}
		return p, true
	case "https", "http", "ssh", "git":
	default:
		return parsed{}, false
	}
	if u.User != nil {
		p.user = u.User.Username()
	}
	p.host, p.port = hostPort(u.Host)
	if n, err := strconv.ParseUint(cmp.Or(p.port, "0"), 10, 16); err != nil || (p.port != "" && n == 0) {
		return parsed{}, false
	}
	if p.host == "" {
		return parsed{}, false
	}
	return p, true
}

// scpLike rewrites a scp-like URL, [user@]host:path, as an ssh:// one; ok is false for anything
// else. The path of a scp-like URL is relative to the login's home, which Git servers take as
// their root: git@host:org/repo is ssh://git@host/org/repo.
func scpLike(raw string) (string, bool) {
	user, rest, hasUser := strings.Cut(raw, "@")
	if !hasUser {
		user, rest = "", raw
	}
	var host, p string
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]:")
		if end < 0 {
			return "", false
		}
		host, p = rest[:end+1], rest[end+2:]
	} else {
		var ok bool
		if host, p, ok = strings.Cut(rest, ":"); !ok {
			return "", false
		}
	}
	if host == "" || p == "" || (hasUser && user == "") || strings.ContainsAny(host, "/@") || strings.ContainsAny(user, "/:") {
		return "", false
	}
	u := url.URL{Scheme: "ssh", Host: host, Path: "/" + p}
	if user != "" {
		u.User = url.User(user)
	}
	return u.String(), true
}

// hostPort splits a URL's host[:port] and canonicalizes the host: lower case, without the
// trailing dot of a fully qualified name, an IP address in its shortest form (without a zone).
// A host that is neither an IP address nor a host name is "".
func hostPort(hp string) (host, port string) {
	host = hp
	if h, p, err := net.SplitHostPort(hp); err == nil {
		host, port = h, p
	}
	host = strings.TrimRight(strings.ToLower(strings.Trim(host, "[]")), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.WithZone("").Unmap().String(), strings.TrimLeft(port, "0")
	}
	if strings.ContainsFunc(host, func(r rune) bool {
		return r < 0x80 && r != '-' && r != '.' && r != '_' && (r < 'a' || r > 'z') && (r < '0' || r > '9')
	}) {
		return "", "" // not a host name
	}
	return host, strings.TrimLeft(port, "0")
}

// cleanPath is a repository's path: "/"-rooted, repeated slashes collapsed, "." and ".."
// resolved, without a trailing "/" or ".git" (either, repeatedly: "/org/repo.git/" and
// "/org/repo/.git" are "/org/repo"). A repository a server serves at its root is "/".
func cleanPath(p string) string {
	p = path.Clean("/" + p)
	for {
		trimmed := strings.TrimSuffix(strings.TrimSuffix(p, "/"), ".git")
		if trimmed == p {
			break
		}
		p = trimmed
	}
	if p == "" {
		return "/"
	}
	return p
}
