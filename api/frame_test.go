package api

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	big := bytes.Repeat([]byte{0xff, 0x00, 0xc3}, 40000) // invalid UTF-8 passes unchanged
	frames := []struct {
		kind byte
		p    []byte
	}{{FrameStdout, []byte("hi\n")}, {FrameStderr, big}, {FrameEOF, nil}, {FrameExit, []byte(`{"exit_code":3}`)}}
	for _, f := range frames {
		if err := WriteFrame(&b, f.kind, f.p); err != nil {
			t.Fatal(err)
		}
	}
	fr := NewFrameReader(&b)
	for _, f := range frames {
		k, p, err := fr.Next()
		if err != nil || k != f.kind || !bytes.Equal(p, f.p) {
			t.Fatalf("got kind %d len %d err %v; want kind %d len %d", k, len(p), err, f.kind, len(f.p))
		}
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("want io.EOF at end, got %v", err)
	}
}

func TestFrameRejectsBadInput(t *testing.T) {
	if err := WriteFrame(io.Discard, FrameStdout, make([]byte, MaxFramePayload+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
	cases := map[string][]byte{
		"huge length":  {FrameStdout, 0xff, 0xff, 0xff, 0xff},
		"unknown kind": {0x42, 0, 0, 0, 0},
		"cut payload":  {FrameStdout, 0, 0, 0, 9, 'a'},
		"cut header":   {FrameStdout, 0},
	}
	for name, in := range cases {
		if _, _, err := NewFrameReader(bytes.NewReader(in)).Next(); err == nil || err == io.EOF {
			t.Errorf("%s: want an error, got %v", name, err)
		}
	}
}

func FuzzFrameReader(f *testing.F) {
	var seed bytes.Buffer
	_ = WriteFrame(&seed, FrameStdout, []byte("hello"))
	_ = WriteFrame(&seed, FrameExit, []byte(`{"exit_code":0}`))
	f.Add(seed.Bytes())
	f.Add([]byte{FrameJSON, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := NewFrameReader(bytes.NewReader(data))
		total := 0
		for {
			k, p, err := fr.Next()
			if err != nil {
				return
			}
			if len(p) > MaxFramePayload || k < FrameStdout || k > FrameResize {
				t.Fatalf("decoder accepted an invalid frame: kind %d len %d", k, len(p))
			}
			total += FrameHeaderSize + len(p)
			if total > len(data) {
				t.Fatalf("decoded more bytes than were given")
			}
		}
	})
}
