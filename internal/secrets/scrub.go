package secrets

import (
	"bytes"
	"io"
)

// pair is a byte string and what replaces it.
type pair struct{ from, to []byte }

// replacer rewrites a stream, replacing every occurrence of each pair's
// from by its to, whatever the read boundaries (it holds back the last
// len(longest)-1 bytes until more arrive).
type replacer struct {
	r     io.Reader
	pairs []pair
	keep  int // longest from - 1
	in    []byte
	out   []byte
	eof   bool
	err   error
	rbuf  []byte
}

func newReplacer(r io.Reader, pairs []pair) *replacer {
	keep := 0
	for _, p := range pairs {
		keep = max(keep, len(p.from)-1)
	}
	return &replacer{r: r, pairs: pairs, keep: keep, rbuf: make([]byte, 32<<10)}
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
			n, err := s.r.Read(s.rbuf)
			s.in = append(s.in, s.rbuf[:n]...)
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
// the bytes no match can still start in.
func (s *replacer) process() {
	safe := len(s.in) // a match that starts before safe is complete in in
	if !s.eof {
		safe = max(len(s.in)-s.keep, 0)
	}
	out := s.out[:0:0]
	in := s.in
	for {
		at, which := firstMatch(in, s.pairs)
		if at < 0 || at >= safe {
			break
		}
		out = append(out, in[:at]...)
		out = append(out, s.pairs[which].to...)
		consumed := at + len(s.pairs[which].from)
		in = in[consumed:]
		safe -= consumed
	}
	if safe > 0 {
		out = append(out, in[:safe]...)
		in = in[safe:]
	}
	s.out = out
	s.in = append(s.in[:0:0], in...)
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
