package secrets

import (
	"bytes"
	"io"
	"sync"
)

// pair is a byte string and what replaces it.
type pair struct{ from, to []byte }

// replacer rewrites a stream, replacing every occurrence of each pair's
// from by its to, whatever the read boundaries (it holds back only an
// end of what it read that could begin a from, until more arrives).
type replacer struct {
	r     io.Reader
	pairs []pair
	keep  int // longest from - 1
	in    []byte
	out   []byte
	eof   bool
	err   error
	// spare is the buffer in is not: out points into one while in
	// fills the other, swapped as out empties.
	spare []byte
}

// bufSize is the size of a replacer's two buffers, from bufs: large, so
// that a download goes out in few, large writes.
const bufSize = 256 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, bufSize); return &b }}

func getBuf() []byte { return (*bufs.Get().(*[]byte))[:0] }

// release gives the replacer's buffers back; it is not read again.
func (s *replacer) release() {
	for _, b := range [][]byte{s.in, s.spare} {
		if cap(b) == bufSize {
			b = b[:0]
			bufs.Put(&b)
		}
	}
	s.in, s.spare, s.out = nil, nil, nil
	s.eof = true
}

func newReplacer(r io.Reader, pairs []pair) *replacer {
	keep := 0
	for _, p := range pairs {
		keep = max(keep, len(p.from)-1)
	}
	return &replacer{r: r, pairs: pairs, keep: keep, in: getBuf(), spare: getBuf()}
}

func (s *replacer) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.eof && len(s.in) == 0 {
			if s.err != nil {
				return 0, s.err
			}
			return 0, io.EOF
		}
		if !s.eof {
			// Read after what is held back, into the same buffer.
			if cap(s.in)-len(s.in) < 64<<10 {
				grown := make([]byte, len(s.in), len(s.in)+bufSize)
				copy(grown, s.in)
				s.in = grown
			}
			n, err := s.r.Read(s.in[len(s.in):cap(s.in)])
			s.in = s.in[:len(s.in)+n]
			if err != nil {
				s.eof = true
				if err != io.EOF {
					s.err = err
				}
			}
			if n == 0 && !s.eof {
				continue
			}
		}
		s.process()
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// process moves what is certain from in to out: every match found, and
// the bytes no match can still start in. Without a match, out is in's
// own bytes (no copy); what is held back moves to the spare buffer,
// which in becomes.
func (s *replacer) process() {
	safe := len(s.in) // a match that starts before safe is complete in in
	if !s.eof {
		safe -= s.holdback(s.in)
	}
	at, which := firstMatch(s.in, s.pairs)
	if at < 0 || at >= safe {
		// The common case: nothing to replace. Hand out in[:safe] as it
		// is and keep the rest, in a buffer of its own (out still points
		// into this one).
		old := s.in
		s.out = old[:safe]
		s.in = append(s.spare[:0], old[safe:]...)
		// Free once out is read: process runs only when it has been.
		s.spare = old[:0]
		return
	}
	var out []byte
	in := s.in
	for at >= 0 && at < safe {
		out = append(out, in[:at]...)
		out = append(out, s.pairs[which].to...)
		consumed := at + len(s.pairs[which].from)
		in = in[consumed:]
		safe -= consumed
		at, which = firstMatch(in, s.pairs)
	}
	if safe > 0 {
		out = append(out, in[:safe]...)
		in = in[safe:]
	}
	old := s.in
	s.out = out
	s.in = append(s.spare[:0], in...)
	s.spare = old[:0]
}

// holdback is how many of b's last bytes could start a match that more
// input would complete: the longest end of b that begins some from.
// Only those wait for more input; the rest (a stream's event, a line)
// goes on at once.
func (s *replacer) holdback(b []byte) int {
	for k := min(s.keep, len(b)); k > 0; k-- {
		tail := b[len(b)-k:]
		for _, p := range s.pairs {
			if len(p.from) > k && bytes.HasPrefix(p.from, tail) {
				return k
			}
		}
	}
	return 0
}

// firstMatch returns where the earliest (then longest) from of pairs is
// in b, and which pair it is; -1 if none.
func firstMatch(b []byte, pairs []pair) (at, which int) {
	at = -1
	for i, p := range pairs {
		if len(p.from) == 0 {
			continue
		}
		j := bytes.Index(b, p.from)
		if j >= 0 && (at < 0 || j < at || j == at && len(p.from) > len(pairs[which].from)) {
			at, which = j, i
		}
	}
	return at, which
}

// replaceAll applies pairs to b, as the replacer does to a stream.
func replaceAll(b []byte, pairs []pair) []byte {
	var out []byte
	for {
		at, which := firstMatch(b, pairs)
		if at < 0 {
			if out == nil {
				return b
			}
			return append(out, b...)
		}
		out = append(out, b[:at]...)
		out = append(out, pairs[which].to...)
		b = b[at+len(pairs[which].from):]
	}
}
