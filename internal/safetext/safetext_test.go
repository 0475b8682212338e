package safetext

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestStrip(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"plain text, ünïcödé, 日本語\n\tindented", "plain text, ünïcödé, 日本語\n\tindented"},
		{"\x1b]0;pwned\x07\x1b[2Jafter", "after"},
		{"title \x1b]2;x\x1b\\done", "title done"},
		{"\x1b[31;1mred\x1b[0m", "red"},
		{"\x1b[?25l hidden cursor", " hidden cursor"},
		{"unterminated \x1b]0;to the end", "unterminated "},
		{"osc \x1b]0;stops at the line\nnext", "osc \nnext"},
		{"two-char \x1bcreset", "two-char reset"},
		{"lone ESC at the end \x1b", "lone ESC at the end "},
		{"bell\x07 backspace\x08 cr\r nul\x00 del\x7f", "bell backspace cr nul del"},
		{"c1 \u009b31m csi and \u009d osc", "c1 31m csi and  osc"},
		{"raw c1 \x9b31m", "raw c1 31m"},
		{"invalid \xff\xfe utf-8", "invalid  utf-8"},
		{"bidi \u202eevil\u202c \u2066x\u2069 \u200f\u061c", "bidi evil x "},
		{"a real \ufffd stays", "a real \ufffd stays"},
	} {
		require.Equal(t, tt.want, Strip(tt.in), "%q", tt.in)
	}
}

func TestWriter(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	in := "line one\n\x1b]0;pwned\x07\x1b[2Jline two\n"
	n, err := w.Write([]byte(in))
	require.NoError(t, err)
	require.Equal(t, len(in), n)
	require.Equal(t, "line one\nline two\n", b.String())
}

// FuzzStrip: whatever the input, the output holds no control character but line feed and tab,
// no bidirectional control, only UTF-8, and is its own Strip.
func FuzzStrip(f *testing.F) {
	for _, s := range []string{"\x1b]0;pwned\x07\x1b[2J", "\x1b[", "\x1b]", "\u202e\u009b", "\xff", "ok\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Strip(s)
		if !utf8.ValidString(out) {
			t.Fatalf("Strip(%q) = %q is not UTF-8", s, out)
		}
		if i := strings.IndexFunc(out, unsafe); i >= 0 || strings.ContainsRune(out, 0x1b) {
			t.Fatalf("Strip(%q) = %q keeps a control character", s, out)
		}
		if again := Strip(out); again != out {
			t.Fatalf("Strip is not idempotent on %q: %q then %q", s, out, again)
		}
	})
}
