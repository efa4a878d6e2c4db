package mcpserver

import (
	"strings"
	"testing"
)

func TestLimitedBufferKeepsHeadAndTail(t *testing.T) {
	var b limitedBuffer
	b.Write([]byte("small"))
	if b.String() != "small" {
		t.Fatalf("%q", b.String())
	}
	var big limitedBuffer
	big.Write([]byte("HEAD"))
	for i := 0; i < 1000; i++ {
		big.Write([]byte(strings.Repeat("m", 1000)))
	}
	big.Write([]byte("TAIL"))
	s := big.String()
	if !strings.HasPrefix(s, "HEAD") || !strings.HasSuffix(s, "TAIL") || len(s) > OutputLimit+200 || !strings.Contains(s, "bytes omitted") {
		t.Fatalf("len %d, prefix %q, suffix %q", len(s), s[:10], s[len(s)-10:])
	}
	if big.total != 1000008 {
		t.Fatalf("total %d", big.total)
	}
}

func TestCheckPath(t *testing.T) {
	for _, bad := range []string{"", "rel/path", "a\x00b"} {
		if checkPath(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if checkPath("/root/x") != nil {
		t.Error("absolute path refused")
	}
}
