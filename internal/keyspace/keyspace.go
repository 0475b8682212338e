// Package keyspace validates the Redis key prefix under which every kubescribe key lives and
// builds keys beneath it. Each package that stores state owns and documents its own keys; this
// package only guarantees they share one validated prefix.
package keyspace

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the prefix used when none is configured.
const DefaultPrefix = "kubescribe"

// maxPrefixLen bounds the prefix so keys stay short; Redis itself allows 512 MB keys.
const maxPrefixLen = 128

// Prefix is a validated key prefix. The zero value is not valid; use Parse.
type Prefix struct{ p string }

// Parse validates a prefix. It is validated, not escaped: characters that are special in Redis
// glob patterns (SCAN MATCH, KEYS, PSUBSCRIBE) and '%' are refused, so a prefix can be used in a
// pattern as is. ':' is allowed, as the conventional separator; trailing ':' are trimmed because
// the separator is added when building keys.
func Parse(s string) (Prefix, error) {
	trimmed := strings.TrimRight(s, ":")
	switch {
	case trimmed == "":
		return Prefix{}, fmt.Errorf("redis key prefix %q: must not be empty", s)
	case len(trimmed) > maxPrefixLen:
		return Prefix{}, fmt.Errorf("redis key prefix %q: longer than %d characters", s, maxPrefixLen)
	}
	for i, r := range trimmed {
		switch {
		case r == '*' || r == '?' || r == '[' || r == ']' || r == '\\' || r == '^' || r == '{' || r == '}':
			return Prefix{}, fmt.Errorf("redis key prefix %q: character %q at %d is a Redis glob or hash-tag character", s, r, i)
		case r == '%':
			return Prefix{}, fmt.Errorf("redis key prefix %q: character '%%' at %d is not allowed", s, i)
		case r <= ' ' || r == 0x7f:
			return Prefix{}, fmt.Errorf("redis key prefix %q: whitespace or control character at %d", s, i)
		case r > 0x7e:
			return Prefix{}, fmt.Errorf("redis key prefix %q: non-ASCII character %q at %d", s, r, i)
		}
	}
	return Prefix{p: trimmed}, nil
}

// MustParse is Parse for constants and tests; it panics on an invalid prefix.
func MustParse(s string) Prefix {
	p, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return p
}

// String returns the prefix without a trailing separator.
func (p Prefix) String() string { return p.p }

// Key joins the prefix and parts with ':'.
func (p Prefix) Key(parts ...string) string {
	var b strings.Builder
	b.WriteString(p.p)
	for _, part := range parts {
		b.WriteByte(':')
		b.WriteString(part)
	}
	return b.String()
}
