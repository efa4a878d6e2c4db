package cli

import (
	"strings"
	"testing"
)

// A sandbox's log reaches a terminal with its control characters
// escaped, a line at a time; piped, it is left as it is.
func TestCopyLogEscapes(t *testing.T) {
	in := "plain\n\x1b]0;owned\a\x1b[2Jcleared\r\nlast without end"
	var term, raw strings.Builder
	if err := copyLog(&term, strings.NewReader(in), true); err != nil {
		t.Fatal(err)
	}
	if want := "plain\n\\x1b]0;owned\\a\\x1b[2Jcleared\\r\nlast without end"; term.String() != want {
		t.Errorf("on a terminal: %q, want %q", term.String(), want)
	}
	if err := copyLog(&raw, strings.NewReader(in), false); err != nil {
		t.Fatal(err)
	}
	if raw.String() != in {
		t.Errorf("piped: %q, want it as it is", raw.String())
	}
	// A line longer than the reader's buffer is escaped too, in pieces.
	long := strings.Repeat("\x1b", 100<<10) + "\n"
	term.Reset()
	if err := copyLog(&term, strings.NewReader(long), true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(term.String(), "\x1b") || term.String() != strings.Repeat(`\x1b`, 100<<10)+"\n" {
		t.Errorf("a long line is not escaped whole (%d bytes out)", term.Len())
	}
}
