package audit

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is the JSON tokenizer the decoder is built on. It reads the body once, front to
// back, validating every byte as encoding/json.Valid does (RFC 8259: structure, strings,
// escapes, numbers, literals; raw bytes of strings are not checked for UTF-8, as json.Valid
// does not), and lets the decoder pick out the few values a fact needs while it skips the rest
// without building anything.
//
// The first syntax error ends the scan: the scanner panics with a *syntaxError, which decode
// recovers (see scanBody). Type errors are not the scanner's business: the decoder checks the
// first byte of a value and skips a value of the wrong type.
type scanner struct {
	data []byte
	pos  int
	// stack holds the open containers ('{' or '[') of the value skipValue is skipping.
	stack []byte
	// scratch is reused to unescape strings.
	scratch []byte
}

// maxDepth bounds the nesting of a JSON value, as encoding/json does: a body of nothing but
// '[' is a syntax error, not a 10 MiB deep stack.
const maxDepth = 10000

// syntaxError is a JSON syntax error at a byte offset of the body. Its message quotes at most
// one character of the input.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string { return e.msg }

func (s *scanner) fail(msg string) {
	panic(&syntaxError{off: s.pos, msg: msg})
}

// failChar reports the byte at the current position as unexpected, or the end of the input.
func (s *scanner) failChar(context string) {
	if s.pos >= len(s.data) {
		s.fail("unexpected end of JSON input")
	}
	s.fail("invalid character " + quoteChar(s.data[s.pos]) + " " + context)
}

func quoteChar(c byte) string {
	if c == '\'' {
		return `'\''`
	}
	if c == '"' {
		return `'"'`
	}
	if c >= 0x20 && c < 0x7f {
		return "'" + string(rune(c)) + "'"
	}
	return strconv.Quote(string(rune(c)))
}

// ws reports the JSON whitespace bytes.
var ws = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// plain reports the bytes a string may hold without a closer look: not '"', not '\\', not a
// control character.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// skipWS skips whitespace and returns the next byte, or 0 at the end of the input.
func (s *scanner) skipWS() byte {
	d, i := s.data, s.pos
	for i < len(d) && ws[d[i]] {
		i++
	}
	s.pos = i
	if i < len(d) {
		return d[i]
	}
	return 0
}

// expect consumes byte c, after whitespace.
func (s *scanner) expect(c byte, context string) {
	if s.skipWS() != c {
		s.failChar(context)
	}
	s.pos++
}

// str scans the string at the current position (which holds '"') and returns its raw content
// span [start, end) and whether it holds an escape. The position ends after the closing quote.
func (s *scanner) str() (start, end int, escaped bool) {
	d := s.data
	i := s.pos + 1
	start = i
	for {
		for i < len(d) && plain[d[i]] {
			i++
		}
		if i >= len(d) {
			s.pos = i
			s.fail("unexpected end of JSON input")
		}
		switch c := d[i]; {
		case c == '"':
			s.pos = i + 1
			return start, i, escaped
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				s.pos = i + 1
				s.fail("unexpected end of JSON input")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(d) {
						s.pos = i + k
						s.fail("unexpected end of JSON input")
					}
					if !isHex(d[i+k]) {
						s.pos = i + k
						s.failChar("in \\u hexadecimal character escape")
					}
				}
				i += 6
			default:
				s.pos = i + 1
				s.failChar("in string escape code")
			}
		default: // a control character
			s.pos = i
			s.failChar("in string literal")
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// unescape returns the content of a scanned string as encoding/json decodes it: escapes
// resolved, an invalid surrogate or invalid UTF-8 replaced by U+FFFD. The result aliases
// s.scratch or the input: it is valid until the next call, and must be copied to be kept.
func (s *scanner) unescape(start, end int, escaped bool) []byte {
	raw := s.data[start:end]
	if !escaped {
		if utf8.Valid(raw) {
			return raw
		}
	}
	b := s.scratch[:0]
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			switch raw[i+1] {
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r := hex4(raw[i+2 : i+6])
				i += 6
				if utf16.IsSurrogate(r) {
					r2 := utf8.RuneError
					if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						r2 = hex4(raw[i+2 : i+6])
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						i += 6
						r = dec
					} else {
						r = utf8.RuneError
					}
				}
				b = utf8.AppendRune(b, r)
				continue
			default: // '"', '\\', '/'
				b = append(b, raw[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			b = utf8.AppendRune(b, r) // RuneError for an invalid byte, as encoding/json
			i += size
		}
	}
	s.scratch = b
	return b
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// literal consumes the literal lit (true, false or null) at the current position.
func (s *scanner) literal(lit string) {
	d := s.data
	for k := 0; k < len(lit); k++ {
		if s.pos >= len(d) || d[s.pos] != lit[k] {
			s.failChar("in literal " + lit + " (expecting " + quoteChar(lit[k]) + ")")
		}
		s.pos++
	}
}

// number consumes a number at the current position and returns its span.
func (s *scanner) number() (start, end int) {
	d := s.data
	start = s.pos
	i := start
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && '1' <= d[i] && d[i] <= '9':
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
	default:
		s.pos = i
		s.failChar("in numeric literal")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			s.failChar("after decimal point in numeric literal")
		}
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			s.failChar("in exponent of numeric literal")
		}
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
	}
	s.pos = i
	return start, i
}

// skipValue consumes one value of any type, after whitespace, validating it. It is iterative,
// so the depth of a body costs a byte of s.stack per level, not a stack frame.
func (s *scanner) skipValue() {
	stack := s.stack[:0]
	defer func() { s.stack = stack[:0] }()
	for {
		// A value is expected.
		switch c := s.skipWS(); c {
		case '{':
			if len(stack) >= maxDepth {
				s.fail("exceeded max depth")
			}
			s.pos++
			if s.skipWS() == '}' {
				s.pos++
				break
			}
			stack = append(stack, '{')
			s.key()
			continue
		case '[':
			if len(stack) >= maxDepth {
				s.fail("exceeded max depth")
			}
			s.pos++
			if s.skipWS() == ']' {
				s.pos++
				break
			}
			stack = append(stack, '[')
			continue
		case '"':
			s.str()
		case 't':
			s.literal("true")
		case 'f':
			s.literal("false")
		case 'n':
			s.literal("null")
		default:
			if c != '-' && (c < '0' || c > '9') {
				s.failChar("looking for beginning of value")
			}
			s.number()
		}
		// A value ended: close containers until one continues.
		for {
			if len(stack) == 0 {
				return
			}
			top := stack[len(stack)-1]
			c := s.skipWS()
			if c == ',' {
				s.pos++
				if top == '{' {
					s.key()
				}
				break
			}
			if top == '{' && c == '}' || top == '[' && c == ']' {
				s.pos++
				stack = stack[:len(stack)-1]
				continue
			}
			if top == '{' {
				s.failChar("after object key:value pair")
			}
			s.failChar("after array element")
		}
	}
}

// key consumes an object key and its colon.
func (s *scanner) key() {
	if s.skipWS() != '"' {
		s.failChar("looking for beginning of object key string")
	}
	s.str()
	s.expect(':', "after object key")
}

// object iterates over the members of the object at the current position (which holds '{'):
// each call returns the next key, unescaped, with the position at its value, which the caller
// must consume; false once the object is closed. first must start true.
func (s *scanner) object(first *bool) (key []byte, ok bool) {
	c := s.skipWS()
	if *first {
		*first = false
		s.pos++ // '{'
		c = s.skipWS()
		if c == '}' {
			s.pos++
			return nil, false
		}
	} else {
		switch c {
		case '}':
			s.pos++
			return nil, false
		case ',':
			s.pos++
			c = s.skipWS()
		default:
			s.failChar("after object key:value pair")
		}
	}
	if c != '"' {
		s.failChar("looking for beginning of object key string")
	}
	start, end, esc := s.str()
	if esc {
		key = s.unescape(start, end, esc)
	} else {
		key = s.data[start:end]
	}
	s.expect(':', "after object key")
	s.skipWS()
	return key, true
}

// array iterates over the elements of the array at the current position (which holds '['):
// each call leaves the position at the next element, which the caller must consume; false
// once the array is closed. first must start true.
func (s *scanner) array(first *bool) bool {
	c := s.skipWS()
	if *first {
		*first = false
		s.pos++ // '['
		if s.skipWS() == ']' {
			s.pos++
			return false
		}
		return true
	}
	switch c {
	case ']':
		s.pos++
		return false
	case ',':
		s.pos++
		s.skipWS()
		return true
	}
	s.failChar("after array element")
	return false
}

// peek returns the first byte of the value at the current position, after whitespace.
func (s *scanner) peek() byte { return s.skipWS() }
