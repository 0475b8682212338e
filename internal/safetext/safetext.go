// Package safetext removes from text what a terminal would act on instead of showing: control
// characters, escape sequences and bidirectional overrides. kubescribe applies it to text others
// chose that it shows to people: status conditions (which may name a URL, a folder's file names)
// and everything `kubescribe doctor` prints. A terminal that is sent "\x1b]0;…\x07" retitles its
// window, "\x1b[2J" clears the screen, and a right-to-left override makes a line read other than
// it is; with this package applied, such text shows as what is left of it.
package safetext

import (
	"io"
	"strings"
	"unicode/utf8"
)

// Strip returns s without control characters (C0 but line feed and tab, DEL, C1), the escape
// sequences the ESC character introduces (CSI, OSC, DCS, and two-character ones), bidirectional
// controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), and bytes that are not UTF-8.
// Text without any of these is returned as it is.
func Strip(s string) string {
	if clean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == 0x1b:
			i += escapeLen(s[i:])
			continue
		case r == utf8.RuneError && n <= 1, unsafe(r):
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// clean reports whether s holds nothing Strip removes.
func clean(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == 0x1b || (r == utf8.RuneError && n <= 1) || unsafe(r) {
			return false
		}
		i += n
	}
	return true
}

// unsafe reports whether r is a control character other than line feed and tab, or a
// bidirectional control.
func unsafe(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// escapeLen is the length of the escape sequence s starts with (s[0] is ESC): CSI (ESC [
// parameters, intermediates, a final byte), a string sequence (OSC ESC ], DCS ESC P, SOS ESC X,
// PM ESC ^, APC ESC _) up to its terminator (BEL or ESC \), or ESC and one more character. An
// unterminated sequence runs to the end of s.
func escapeLen(s string) int {
	if len(s) < 2 {
		return len(s)
	}
	switch s[1] {
	case '[':
		i := 2
		for i < len(s) && s[i] >= 0x20 && s[i] <= 0x3f {
			i++ // parameters and intermediates
		}
		if i < len(s) && s[i] >= 0x40 && s[i] <= 0x7e {
			i++ // the final byte
		}
		return i
	case ']', 'P', 'X', '^', '_':
		for i := 2; i < len(s); i++ {
			switch {
			case s[i] == 0x07:
				return i + 1
			case s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\':
				return i + 2
			case s[i] == '\n':
				return i // a string sequence never runs past a line: the line's end stays
			}
		}
		return len(s)
	}
	if s[1] < 0x20 || s[1] > 0x7e {
		return 1 // ESC alone: what follows is judged on its own
	}
	return 2
}

// writer is an io.Writer that writes what it is given through Strip.
type writer struct{ w io.Writer }

// NewWriter returns a writer that strips (Strip) everything written through it before it reaches
// w. Each Write is stripped on its own: an escape sequence split across two writes loses its ESC,
// and the rest shows as text.
func NewWriter(w io.Writer) io.Writer { return writer{w} }

// Write writes Strip(p) and reports len(p) written when that succeeded.
func (w writer) Write(p []byte) (int, error) {
	if _, err := io.WriteString(w.w, Strip(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
