package layerstore

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// chunkPipe hands bytes from one goroutine to another in large chunks,
// several of them in flight, so that the writer (reading a layer,
// decompressing it) runs ahead of the reader (applying its tar to disk)
// instead of waiting at every Write as io.Pipe does: on two cores the
// two halves of an unpack overlap. Its buffers are made as the writer
// needs them, at most chunks+1.
type chunkPipe struct {
	full chan []byte // chunks written, in order
	free chan []byte // empty buffers back to the writer
	done chan struct{}
	size int
	made int // buffers made (the writer's)

	once sync.Once
	werr error // what the reader sees after the last chunk (io.EOF or the writer's error): set before full is closed

	chunk []byte // the reader's chunk
	cur   []byte // what is left of it to read
	buf   []byte // the writer's chunk being filled
}

func newChunkPipe(chunks, size int) *chunkPipe {
	return &chunkPipe{full: make(chan []byte, chunks), free: make(chan []byte, chunks+1), done: make(chan struct{}), size: size}
}

// errReaderGone is what the writer of a pipe gets once its reader
// stopped.
var errReaderGone = errors.New("layerstore: the unpack stopped reading")

// take gives the writer a buffer to fill, once there is one.
func (p *chunkPipe) take() error {
	select {
	case <-p.done: // the reader stopped: read no more for it
		return errReaderGone
	default:
	}
	if p.buf != nil {
		return nil
	}
	select {
	case p.buf = <-p.free:
		return nil
	default:
	}
	if p.made < cap(p.free) {
		p.made++
		p.buf = make([]byte, 0, p.size)
		return nil
	}
	select {
	case p.buf = <-p.free:
		return nil
	case <-p.done:
		return errReaderGone
	}
}

// ReadFrom fills chunks from r until r's EOF (nil) or error.
func (p *chunkPipe) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for {
		if err := p.take(); err != nil {
			return n, err
		}
		k, err := r.Read(p.buf[len(p.buf):cap(p.buf)])
		p.buf = p.buf[:len(p.buf)+k]
		n += int64(k)
		if len(p.buf) == cap(p.buf) {
			if serr := p.send(); serr != nil {
				return n, serr
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

func (p *chunkPipe) send() error {
	select {
	case <-p.done:
		return errReaderGone
	default:
	}
	select {
	case p.full <- p.buf:
		p.buf = nil
		return nil
	case <-p.done:
		return errReaderGone
	}
}

// CloseWrite sends what is buffered and ends the stream: the reader
// reads err (io.EOF if nil) after the last byte.
func (p *chunkPipe) CloseWrite(err error) {
	if len(p.buf) > 0 {
		if serr := p.send(); err == nil {
			err = serr
		}
	}
	if err == nil {
		err = io.EOF
	}
	p.werr = err
	close(p.full)
}

// Read returns the chunks' bytes in order, then the writer's end.
func (p *chunkPipe) Read(b []byte) (int, error) {
	for len(p.cur) == 0 {
		if p.chunk != nil {
			p.free <- p.chunk[:0]
			p.chunk = nil
		}
		c, ok := <-p.full
		if !ok {
			return 0, p.werr
		}
		p.chunk, p.cur = c, c
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	return n, nil
}

// CloseRead stops the reader's side: the writer's next send fails with
// errReaderGone.
func (p *chunkPipe) CloseRead() {
	p.once.Do(func() { close(p.done) })
}

// Prefetch returns b reading ahead: a goroutine opens it now and reads
// up to ahead bytes of it before its Open is called (the next layer of
// an image comes from the registry while the one before it unpacks).
// stop ends the read ahead; it must be called once the returned Blob is
// no longer used, opened or not. It does not wait: a read the source
// does not answer ends the goroutine, which closes the source, once it
// returns. The blob opens once.
func Prefetch(b Blob, ahead int) (pre Blob, stop func()) {
	const chunk = 1 << 20
	pipe := newChunkPipe(max(ahead/chunk, 1), chunk)
	go func() {
		rc, err := b.Open()
		if err != nil {
			pipe.CloseWrite(err)
			return
		}
		defer rc.Close()
		_, err = pipe.ReadFrom(rc)
		pipe.CloseWrite(err)
	}()
	var opened atomic.Bool
	pre = b
	pre.Open = func() (io.ReadCloser, error) {
		if opened.Swap(true) {
			return nil, errors.New("layerstore: a prefetched layer opens once")
		}
		return prefetched{pipe}, nil
	}
	return pre, pipe.CloseRead
}

type prefetched struct{ *chunkPipe }

func (p prefetched) Close() error { p.CloseRead(); return nil }
