package termsafe

import (
	"testing"
	"unicode/utf8"
)

func TestEscapeTerminalStrings(t *testing.T) {
	for in, want := range map[string]string{
		"plain-name.txt":               "plain-name.txt",
		"\x1b]0;pwned\x07":             `\x1b]0;pwned\a`,
		"a\x9bb":                       `a\x9bb`, // a lone C1 byte: invalid UTF-8
		"a\u009bb":                     `a\u009bb`,
		"a\rb\nc\td":                   `a\rb\nc\td`,
		"del\x7f":                      `del\x7f`,
		"nul\x00":                      `nul\x00`,
		"evil\u202etxt.exe":            `evil\u202etxt.exe`,
		"\u2066iso\u2069":              `\u2066iso\u2069`,
		"line\u2028sep":                `line\u2028sep`,
		"bad utf8 \xff\xfe":            `bad utf8 \xff\xfe`,
		"héllo wörld 日本語 🙂":            "héllo wörld 日本語 🙂",
		`back\slash`:                   `back\slash`,
		"\xe2\x80":                     `\xe2\x80`, // a cut rune
		"zero\u200bwidth joiner\u200d": "zero\u200bwidth joiner\u200d",
	} {
		got := String(in)
		if got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
		assertSafe(t, got)
	}
}

func assertSafe(t *testing.T, s string) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%q is not valid UTF-8", s)
	}
	for _, r := range s {
		if bad(r) {
			t.Errorf("%q holds %U", s, r)
		}
	}
}

// FuzzString: whatever the input, the output is valid UTF-8 with nothing
// a terminal acts on, and clean input is unchanged.
func FuzzString(f *testing.F) {
	f.Add("\x1b]0;pwned\x07")
	f.Add("a\x9bb\u202e\xff")
	f.Fuzz(func(t *testing.T, s string) {
		assertSafe(t, String(s))
		if firstBad(s) < 0 && String(s) != s {
			t.Errorf("clean %q changed", s)
		}
	})
}
