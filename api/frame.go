package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame kinds of the exec stream. The same framing carries an exec's
// output from the guest agent to the daemon and from the daemon to API
// clients (Content-Type application/vnd.nook.stream).
const (
	FrameStdout byte = 1 // payload: raw bytes written to stdout
	FrameStderr byte = 2 // payload: raw bytes written to stderr
	FrameExit   byte = 3 // payload: JSON ExitStatus; always the last frame of a successful stream
	FrameError  byte = 4 // payload: JSON Error; the stream failed and ends here
	FrameStdin  byte = 5 // payload: raw bytes for the process's stdin (client to sandbox)
	FrameEOF    byte = 6 // payload: empty; closes the process's stdin
	FrameSignal byte = 7 // payload: signal name, e.g. "TERM"
	FrameJSON   byte = 8 // payload: a JSON control message (requests and replies of the agent protocol)
	FrameResize byte = 9 // payload: JSON WindowSize; resizes a process's terminal (client to sandbox)
)

// WindowSize is the payload of a FrameResize.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// MaxFramePayload bounds one frame so that a peer cannot make the reader
// allocate without limit.
const MaxFramePayload = 1 << 20

// ErrFrameTooLarge is returned for a frame header announcing more than MaxFramePayload bytes.
var ErrFrameTooLarge = errors.New("frame payload exceeds 1 MiB")

// FrameHeaderSize is the size of a frame header: kind (1 byte) and big-endian payload length (4 bytes).
const FrameHeaderSize = 5

// WriteFrame writes one frame. It is not safe for concurrent use on the same writer.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload) > MaxFramePayload {
		return ErrFrameTooLarge
	}
	var hdr [FrameHeaderSize]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	if len(payload) > 4096 {
		// Large payloads are not worth a copy: two writes.
		if _, err := w.Write(hdr[:]); err != nil {
			return err
		}
		_, err := w.Write(payload)
		return err
	}
	// One write for header and payload keeps small frames in one packet.
	var small [FrameHeaderSize + 4096]byte
	copy(small[:], hdr[:])
	n := copy(small[FrameHeaderSize:], payload)
	_, err := w.Write(small[:FrameHeaderSize+n])
	return err
}

// FrameReader reads frames from a stream, reusing one buffer.
type FrameReader struct {
	r   io.Reader
	hdr [FrameHeaderSize]byte
	buf []byte
}

// NewFrameReader returns a FrameReader reading from r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Reset makes the reader read from r, keeping its buffer.
func (fr *FrameReader) Reset(r io.Reader) { fr.r = r }

// Next returns the next frame. The payload is valid until the next call.
// At a clean end of stream it returns io.EOF; a stream cut inside a frame
// returns io.ErrUnexpectedEOF.
func (fr *FrameReader) Next() (kind byte, payload []byte, err error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return 0, nil, err
	}
	kind = fr.hdr[0]
	if kind < FrameStdout || kind > FrameResize {
		return 0, nil, fmt.Errorf("unknown frame kind %d", kind)
	}
	n := binary.BigEndian.Uint32(fr.hdr[1:])
	if n > MaxFramePayload {
		return 0, nil, ErrFrameTooLarge
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	fr.buf = fr.buf[:n]
	if _, err := io.ReadFull(fr.r, fr.buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return kind, fr.buf, nil
}

// StreamContentType is the media type of an exec stream of frames.
const StreamContentType = "application/vnd.nook.stream"
