package api

import "testing"

func TestModeRoundTrip(t *testing.T) {
	for _, b := range []uint32{0, 0o644, 0o755, 0o4755, 0o2750, 0o1777, 0o7777} {
		if got := ModeBits(FileModeOf(b)); got != b {
			t.Errorf("%04o -> %v -> %04o", b, FileModeOf(b), got)
		}
	}
}
