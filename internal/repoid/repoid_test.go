package repoid

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The spellings of one repository an attacker would try: every one is the same repository.
func TestSameRepositorySpellings(t *testing.T) {
	const base = "https://git.example.com/org/repo"
	for _, other := range []string{
		base,
		"https://git.example.com:443/org/repo",
		"https://git.example.com//org/repo",
		"https://git.example.com/org//repo",
		"https://git.example.com/org/repo/?",
		"https://git.example.com/org/repo?ref=main#frag",
		"https://git.example.com/org/repo.git",
		"https://git.example.com/org/repo.git/",
		"https://git.example.com/org/repo/.git",
		"https://git.example.com/org/./x/../repo",
		"https://git.example.com/org/%72epo",
		"HTTPS://GIT.Example.COM/Org/Repo",
		"https://git.example.com./org/repo",
		"  https://git.example.com/org/repo  ",
		"https://robot:secret@git.example.com/org/repo",
		"http://git.example.com/org/repo",
		"http://git.example.com:80/org/repo",
		"https://git.example.com:8443/org/repo",
		"ssh://git@git.example.com/org/repo",
		"ssh://git@git.example.com:22/org/repo.git",
		"ssh://git@git.example.com:2222/org/repo",
		"ssh://git.example.com/org/repo",
		"git@git.example.com:org/repo",
		"git@git.example.com:org/repo.git",
		"git@git.example.com:/org/repo",
		"git.example.com:org/repo",
		"git://git.example.com/org/repo",
	} {
		require.True(t, Same(base, other), "%q", other)
		require.True(t, Same(other, base), "%q", other)
		require.Equal(t, Of(base), Of(other), "%q", other)
	}
}

func TestOtherRepositories(t *testing.T) {
	const base = "https://git.example.com/org/repo"
	for _, other := range []string{
		"https://git.example.com/org/other",
		"https://git.example.com/org/repo/sub",
		"https://git.example.com/org",
		"https://git.example.org/org/repo",
		"https://git.example.com.evil.example/org/repo",
		"git@git.example.org:org/repo",
		"file:///org/repo",
	} {
		require.False(t, Same(base, other), "%q", other)
	}
}

func TestCanonical(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"https://git.example.com:443//org/repo/?", "https://git.example.com/org/repo"},
		{"HTTP://Git.Example.com:80/org/repo.git", "http://git.example.com/org/repo"},
		{"https://git.example.com:8443/org/repo", "https://git.example.com:8443/org/repo"},
		{"git@Git.Example.com:org/repo.git", "ssh://git@git.example.com/org/repo"},
		{"ssh://git@git.example.com:22/org/repo", "ssh://git@git.example.com/org/repo"},
		{"ssh://git@git.example.com:2222/org/repo", "ssh://git@git.example.com:2222/org/repo"},
		{"git@[2001:DB8::1]:org/repo", "ssh://git@[2001:db8::1]/org/repo"},
		{"https://[2001:db8:0:0::1]:443/org/repo", "https://[2001:db8::1]/org/repo"},
		{"https://robot:secret@git.example.com/org/repo", "https://robot@git.example.com/org/repo"},
		{"file:///srv/git/repo.git/", "file:///srv/git/repo"},
		{"file://localhost/srv//git/repo", "file:///srv/git/repo"},
		{"https://git.example.com:443", "https://git.example.com/"},
		{"https://git.example.com//.git/", "https://git.example.com/"},
	} {
		got, ok := Canonical(tt.in)
		require.True(t, ok, "%q", tt.in)
		require.Equal(t, tt.want, got, "%q", tt.in)
		require.Equal(t, Of(tt.in), Of(got), "the canonical form of %q is the same repository", tt.in)
	}
}

// A repository a server serves at its root is one repository too, whatever the spelling.
func TestRootRepository(t *testing.T) {
	for _, other := range []string{"https://git.example.com/", "https://git.example.com:443", "ssh://git@git.example.com/.git", "https://GIT.example.com//?x"} {
		require.True(t, Same("https://git.example.com", other), "%q", other)
	}
	require.False(t, Same("https://git.example.com", "https://git.example.com/org/repo"))
}

// Garbage has no identity, is compared as written (so never less than before), and nothing
// panics.
func TestGarbage(t *testing.T) {
	for _, in := range []string{
		"", " ", "/", "org/repo", "https://", "https:///org/repo", "ftp://git.example.com/org/repo",
		"file://other-host/srv/repo", "git@", "git@:org/repo", "git@host:", "@host:path",
		"[::1", "git@[::1:org/repo", "https://git.example.com/org/\x1b]0;pwned\x07",
		"git@git.example.com:org/\x1b[2J", "https://%zz/org/repo", "https://git.example.com:99999999999999999999/a",
		"\x00", "\xff\xfe", "a/b:c", "host/x:org/repo",
	} {
		require.NotPanics(t, func() {
			_, ok := Canonical(in)
			require.False(t, ok, "%q", in)
			require.Equal(t, ID(""), Of(in), "%q", in)
			require.Equal(t, strings.TrimSpace(in) != "" && strings.TrimSpace(in) != "/", Same(in, in), "%q", in)
			require.False(t, Same(in, "https://git.example.com/org/repo"), "%q", in)
		})
	}
	require.True(t, Same("FTP://git.example.com/org/repo.git/", "ftp://git.example.com/org/repo"), "compared as written, as before")
}

func FuzzOf(f *testing.F) {
	for _, s := range []string{
		"https://git.example.com:443//org/repo/?", "git@git.example.com:org/repo.git", "ssh://git@[::1]:22/r",
		"file:///srv/repo.git", "https://git.example.com/org/\x1b]0;pwned\x07", "git@[::1:x", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id := Of(s)
		c, ok := Canonical(s)
		if ok != (id != "") {
			t.Fatalf("Canonical(%q) ok=%v, Of=%q", s, ok, id)
		}
		if ok && Of(c) != id {
			t.Fatalf("the canonical form %q of %q is another repository: %q != %q", c, s, Of(c), id)
		}
	})
}
