package layerstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// oddReader gives r's bytes a few at a time, in sizes that never line
// up with a chunk.
type oddReader struct {
	r    io.Reader
	step int
}

func (o *oddReader) Read(p []byte) (int, error) {
	o.step = o.step%7919 + 1
	return o.r.Read(p[:min(len(p), o.step*13)])
}

// The bytes come out as they went in, then the writer's end: EOF, or
// its error.
func TestChunkPipe(t *testing.T) {
	data := make([]byte, 5<<20+12345)
	rand.Read(data)
	for _, werr := range []error{nil, errors.New("the registry hung up")} {
		p := newChunkPipe(3, 64<<10)
		go func() {
			_, err := p.ReadFrom(&oddReader{r: bytes.NewReader(data)})
			if err == nil {
				err = werr
			}
			p.CloseWrite(err)
		}()
		got, err := io.ReadAll(&oddReader{r: p})
		if !bytes.Equal(got, data) {
			t.Errorf("%d bytes out of %d, or not the same", len(got), len(data))
		}
		if err != werr {
			t.Errorf("the reader's end: %v, want %v", err, werr)
		}
		p.CloseRead()
		if p.made > 4 {
			t.Errorf("%d buffers made for 3 chunks in flight", p.made)
		}
	}
}

// A reader that stops frees the writer, wherever it is, with
// errReaderGone.
func TestChunkPipeReaderGone(t *testing.T) {
	p := newChunkPipe(2, 4096)
	done := make(chan error, 1)
	go func() {
		_, err := p.ReadFrom(&oddReader{r: rand.Reader}) // never ends by itself
		done <- err
	}()
	buf := make([]byte, 10000)
	if _, err := io.ReadFull(p, buf); err != nil {
		t.Fatal(err)
	}
	p.CloseRead()
	if err := <-done; !errors.Is(err, errReaderGone) {
		t.Errorf("the writer after its reader stopped: %v", err)
	}
}

// countingSource gives endless bytes, counts them, and checks that the
// read ahead never passes its bound.
type countingSource struct {
	t        *testing.T
	read     atomic.Int64
	consumed *atomic.Int64
	bound    int64
	closed   chan struct{}
}

func (c *countingSource) Read(p []byte) (int, error) {
	if ahead := c.read.Load() - c.consumed.Load(); ahead > c.bound {
		c.t.Errorf("read %d bytes ahead of the reader, bound %d", ahead, c.bound)
	}
	n := min(len(p), 100_000)
	c.read.Add(int64(n))
	return n, nil
}

func (c *countingSource) Close() error { close(c.closed); return nil }

func waitClosed(t *testing.T, c *countingSource, what string) {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(10 * time.Second):
		t.Errorf("%s: the source is still open 10 s after", what)
	}
}

// Prefetch reads at most its bound ahead of its reader, opens once, and
// its stop ends it and closes the source, opened or not.
func TestPrefetch(t *testing.T) {
	const ahead = 4 << 20
	var consumed atomic.Int64
	src := &countingSource{t: t, consumed: &consumed, bound: ahead + 2<<20 + 100_000, closed: make(chan struct{})}
	pre, stop := Prefetch(Blob{Open: func() (io.ReadCloser, error) { return src, nil }}, ahead)
	rc, err := pre.Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pre.Open(); err == nil {
		t.Error("a prefetched blob opened twice")
	}
	buf := make([]byte, 300_000)
	for consumed.Load() < 40<<20 {
		n, err := rc.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		consumed.Add(int64(n))
	}
	rc.Close()
	stop() // again: nothing
	waitClosed(t, src, "Close")

	// Never opened: stop frees it all the same.
	src2 := &countingSource{t: t, consumed: new(atomic.Int64), bound: ahead + 2<<20 + 100_000, closed: make(chan struct{})}
	_, stop2 := Prefetch(Blob{Open: func() (io.ReadCloser, error) { return src2, nil }}, ahead)
	stop2()
	waitClosed(t, src2, "stop of a blob never opened")

	// A source that does not open: the reader gets its error.
	pre3, stop3 := Prefetch(Blob{Open: func() (io.ReadCloser, error) { return nil, context.DeadlineExceeded }}, ahead)
	defer stop3()
	rc3, _ := pre3.Open()
	if _, err := rc3.Read(buf); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read of a blob whose open failed: %v", err)
	}
}
