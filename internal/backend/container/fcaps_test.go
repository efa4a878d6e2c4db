package container

import (
	"encoding/binary"
	"testing"
)

func capsValue(rev uint32, effective bool, permitted uint64) []byte {
	magic := rev
	if effective {
		magic |= 1
	}
	var v []byte
	switch rev {
	case 0x01000000:
		v = make([]byte, 12)
	case 0x02000000:
		v = make([]byte, 20)
	default:
		v = make([]byte, 24)
	}
	binary.LittleEndian.PutUint32(v, magic)
	binary.LittleEndian.PutUint32(v[4:], uint32(permitted))
	if len(v) >= 20 {
		binary.LittleEndian.PutUint32(v[12:], uint32(permitted>>32))
	}
	return v
}

func TestFileCapsExcess(t *testing.T) {
	b := bounding
	const netRaw, chown, audit = 1 << 13, 1 << 0, 1 << 29
	for _, c := range []struct {
		v    []byte
		want uint64
		bad  bool
	}{
		{capsValue(0x02000000, true, netRaw), netRaw, false}, // Debian's ping
		{capsValue(0x03000000, true, netRaw|chown), netRaw, false},
		{capsValue(0x01000000, false, chown), 0, false},
		{capsValue(0x02000000, true, chown), 0, false},
		{capsValue(0x02000000, true, 1<<38), 1 << 38, false}, // a capability past 32 (CAP_CHECKPOINT_RESTORE... 40)
		{capsValue(0x02000000, true, audit), audit, false},
		{[]byte{1, 2}, ^b, true},
		{capsValue(0x02000000, true, 0)[:12], ^b, true},
		{append(capsValue(0x03000000, true, 0), 0), ^b, true},
	} {
		got, err := fileCapsExcess(c.v, b)
		if got != c.want || (err != nil) != c.bad {
			t.Errorf("fileCapsExcess(%x) = %x, %v; want %x (error %v)", c.v, got, err, c.want, c.bad)
		}
	}
}

func FuzzFileCapsExcess(f *testing.F) {
	f.Add(capsValue(0x02000000, true, 1<<13))
	f.Add(capsValue(0x03000000, false, 1))
	f.Add(capsValue(0x01000000, true, 1))
	f.Fuzz(func(t *testing.T, v []byte) {
		b := bounding
		excess, err := fileCapsExcess(v, b)
		if excess&b != 0 {
			t.Fatalf("excess %x overlaps the bounding set", excess)
		}
		if err != nil && excess == 0 {
			t.Fatal("an unparsable value counts as no excess")
		}
	})
}
