// Package termsafe makes strings that come from a sandbox safe to print
// on the operator's terminal. A file name, a process's command line, a
// DNS name a sandbox looked up: any of them can hold escape sequences that
// retitle the window, move the cursor, rewrite what was printed before or,
// on some terminals, answer back into the input. The CLI passes every such
// string through String before printing it for a human; --json output
// is left exact, since JSON escapes control characters itself, and so is content
// the user asked for raw (nook fs cat, exec output).
//
// Escaped, in Go's notation as strconv.Quote writes it (\x1b, \a, \r, \n,
// \u009b, \u202e): the C0 controls (ESC, BEL, CR, ...), DEL, the C1
// controls U+0080-U+009F, each byte of invalid UTF-8 (a lone 0x9b is CSI
// on 8-bit terminals), the Unicode line and paragraph separators, and the
// bidirectional overrides and isolates U+202A-U+202E and U+2066-U+2069
// (which make text read differently from what it is). Everything else,
// other scripts and emoji included, is kept; a backslash is not doubled.
package termsafe

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// String escapes s for printing: every control character, newline and
// tab included, is escaped, so s stays one field of one line.
func String(s string) string {
	i := firstBad(s)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case !bad(r):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\a', '\n', '\u009b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

// firstBad is the index of the first byte to escape, or -1.
func firstBad(s string) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || bad(r) {
			return i
		}
		i += size
	}
	return -1
}

func bad(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069: // bidi embeddings, overrides, isolates
		return true
	}
	return false
}
