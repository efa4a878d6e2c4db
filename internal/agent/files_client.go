package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/nookhq/nook/api"
)

// The daemon side of the file ops (see files.go for the streams). A
// stream the client holds (a read, a tar download, a listing, a watch) is
// closed when ctx ends or when the caller closes it; the agent then stops.

// fileCall runs a file op that answers one FileReply.
func (c *Client) fileCall(ctx context.Context, op string, req *FileRequest) (*FileReply, error) {
	var r FileReply
	w := quick
	if op == OpRemove || op == OpMove {
		w = patient // a recursive remove, or a move that copies, may take long
	}
	st, _, err := c.requestWait(ctx, Request{Op: op, Files: req}, &r, w)
	if err != nil {
		return nil, err
	}
	st.Close()
	return &r, nil
}

func fileOf(r *FileReply, err error) (*api.FileInfo, error) {
	if err != nil {
		return nil, err
	}
	if r.File == nil {
		return nil, errors.New("sandbox agent: reply without file")
	}
	return r.File, nil
}

// Stat describes a path (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, path string) (*api.FileInfo, error) {
	return fileOf(c.fileCall(ctx, OpStat, &FileRequest{Path: path}))
}

// Mkdir creates a directory (with Parents, and its missing parents; an existing directory is then fine).
func (c *Client) Mkdir(ctx context.Context, req *FileRequest) (*api.FileInfo, error) {
	return fileOf(c.fileCall(ctx, OpMkdir, req))
}

// Remove removes a file, an empty directory, or with recursive a whole tree. "/" is refused.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	_, err := c.fileCall(ctx, OpRemove, &FileRequest{Path: path, Recursive: recursive})
	return err
}

// Move renames from to to, copying across file systems; an existing
// destination is an error unless overwrite.
func (c *Client) Move(ctx context.Context, from, to string, overwrite bool) (*api.FileInfo, error) {
	return fileOf(c.fileCall(ctx, OpMove, &FileRequest{Path: from, Dest: to, Overwrite: overwrite}))
}

// Chmod sets a path's permission bits (at most 07777).
func (c *Client) Chmod(ctx context.Context, path string, mode uint32) (*api.FileInfo, error) {
	return fileOf(c.fileCall(ctx, OpChmod, &FileRequest{Path: path, Mode: &mode}))
}

// openStream sends a request and reads its first FileReply; the stream
// stays open, and is closed when ctx ends until stop is called.
func (c *Client) openStream(ctx context.Context, op string, req *FileRequest) (*FileReply, net.Conn, *api.FrameReader, func() bool, error) {
	var r FileReply
	st, fr, err := c.request(ctx, Request{Op: op, Files: req}, &r)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { abort(st) })
	return &r, st, fr, stop, nil
}

// dataReader reads the FrameStdout payloads of a stream up to its FrameEOF.
// agentStream is the open stream of a file request whose answer is read
// over time (a download, a listing, a watch), with the cancellation tied
// to its context. Close ends it at once.
type agentStream struct {
	st   net.Conn
	fr   *api.FrameReader
	stop func() bool
}

// Close ends the stream; the agent stops sending.
func (a *agentStream) Close() error {
	a.stop()
	return abort(a.st)
}

type dataReader struct {
	agentStream
	buf []byte
	err error
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.buf) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		kind, b, err := d.fr.Next()
		switch {
		case err != nil:
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			d.err = fmt.Errorf("sandbox agent: the stream was cut: %w", err)
		case kind == api.FrameStdout:
			d.buf = b
		case kind == api.FrameEOF:
			d.err = io.EOF
		case kind == api.FrameError:
			d.err = decodeAgentError(b)
		default:
			d.err = fmt.Errorf("sandbox agent: unexpected frame %d", kind)
		}
	}
	n := copy(p, d.buf)
	d.buf = d.buf[n:]
	return n, nil
}

// ReadFile opens a regular file for reading from offset, length bytes (0:
// to the end). The reader ends with io.EOF after the last byte, or with
// the error that cut the stream; the caller closes it.
func (c *Client) ReadFile(ctx context.Context, path string, offset, length int64) (*api.FileInfo, io.ReadCloser, error) {
	r, st, fr, stop, err := c.openStream(ctx, OpRead, &FileRequest{Path: path, Offset: offset, Length: length})
	if err != nil {
		return nil, nil, err
	}
	if r.File == nil {
		stop()
		st.Close()
		return nil, nil, errors.New("sandbox agent: reply without file")
	}
	return r.File, &dataReader{agentStream: agentStream{st, fr, stop}}, nil
}

// DownloadTar streams a tar of a file or directory tree; its top entry is
// the path's base name ("." for /).
func (c *Client) DownloadTar(ctx context.Context, path string) (*api.FileInfo, io.ReadCloser, error) {
	r, st, fr, stop, err := c.openStream(ctx, OpTarGet, &FileRequest{Path: path})
	if err != nil {
		return nil, nil, err
	}
	if r.File == nil {
		stop()
		st.Close()
		return nil, nil, errors.New("sandbox agent: reply without file")
	}
	return r.File, &dataReader{agentStream: agentStream{st, fr, stop}}, nil
}

// SourceError is an error reading what the caller gave to upload: the
// upload was abandoned and the sandbox left as it was (for a tar upload,
// as far as it got).
type SourceError struct{ Err error }

func (e *SourceError) Error() string { return fmt.Sprintf("reading the upload: %v", e.Err) }
func (e *SourceError) Unwrap() error { return e.Err }

// upload runs an op that takes a stream: it sends src as FrameStdin
// frames and a FrameEOF while waiting for the agent's answer, which
// comes at the end or as soon as the agent fails.
func (c *Client) upload(ctx context.Context, op string, req *FileRequest, src io.Reader) (*FileReply, error) {
	_, st, fr, stop, err := c.openStream(ctx, op, req)
	if err != nil {
		return nil, err
	}
	defer stop()
	defer st.Close()
	sent := make(chan error, 1)
	go func() { sent <- sendFrames(st, src) }()
	var reply FileReply
	kind, p, rerr := fr.Next()
	if rerr == nil {
		switch kind {
		case api.FrameJSON:
			if err := json.Unmarshal(p, &reply); err != nil {
				rerr = fmt.Errorf("sandbox agent: bad reply: %w", err)
			}
		case api.FrameError:
			rerr = decodeAgentError(p)
		default:
			rerr = fmt.Errorf("sandbox agent: unexpected frame %d", kind)
		}
	} else {
		if ctx.Err() == nil {
			rerr = fmt.Errorf("sandbox agent: %w", rerr)
		}
	}
	st.Close() // stops the sender if the agent answered early
	serr := <-sent
	var se *SourceError
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.As(serr, &se):
		return nil, se
	case rerr != nil:
		return nil, rerr
	}
	return &reply, nil
}

// sendFrames copies src as FrameStdin frames and ends with FrameEOF; a
// failing src ends the stream without FrameEOF (an aborted upload).
func sendFrames(st net.Conn, src io.Reader) error {
	buf := make([]byte, 256<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if werr := api.WriteFrame(st, api.FrameStdin, buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return api.WriteFrame(st, api.FrameEOF, nil)
		}
		if err != nil {
			st.Close()
			return &SourceError{Err: err}
		}
	}
}

// WriteFile replaces (or creates) the file at req.Path with what src
// holds. The agent writes a temporary file and renames it into place; if
// src fails, nothing changes. With no mode, an existing file keeps its
// mode and a new one gets 0644.
func (c *Client) WriteFile(ctx context.Context, req *FileRequest, src io.Reader) (*api.FileInfo, error) {
	return fileOf(c.upload(ctx, OpWrite, req, src))
}

// UploadTar extracts a tar stream into the directory dir (created if
// parents is set), and returns the directory.
func (c *Client) UploadTar(ctx context.Context, dir string, parents bool, src io.Reader) (*api.FileInfo, error) {
	return fileOf(c.upload(ctx, OpTarPut, &FileRequest{Path: dir, Parents: parents}, src))
}

// UploadTree is UploadTar into dir (made with its parents if missing)
// keeping the owners the archive names, and dir's own owner and mode
// from its "." entry: a build's cache, written by the sandbox's users.
func (c *Client) UploadTree(ctx context.Context, dir string, src io.Reader) (*api.FileInfo, error) {
	return fileOf(c.upload(ctx, OpTarPut, &FileRequest{Path: dir, Parents: true, Owners: true}, src))
}

// FileListing is a listing in progress: Next returns batches of entries
// until io.EOF, after which Truncated says whether the cap cut it. The
// cap holds whatever the agent sends: entries beyond it are dropped and
// the listing ends truncated.
type FileListing struct {
	Root      api.FileInfo
	Truncated bool
	agentStream
	done  bool
	max   int // entries asked for
	count int // entries returned
}

// ListFiles lists a directory (req.Recursive: the whole tree) or a single
// file, at most req.MaxEntries entries (0: DefaultListEntries; at most
// MaxListEntries).
func (c *Client) ListFiles(ctx context.Context, req *FileRequest) (*FileListing, error) {
	max := req.MaxEntries
	if max <= 0 {
		max = DefaultListEntries
	}
	max = min(max, MaxListEntries)
	r, st, fr, stop, err := c.openStream(ctx, OpList, req)
	if err != nil {
		return nil, err
	}
	if r.File == nil {
		stop()
		st.Close()
		return nil, errors.New("sandbox agent: reply without file")
	}
	return &FileListing{Root: *r.File, agentStream: agentStream{st, fr, stop}, max: max}, nil
}

// Next returns the next batch of entries, or io.EOF at the end.
func (l *FileListing) Next() ([]api.FileInfo, error) {
	if l.done {
		return nil, io.EOF
	}
	kind, b, err := l.fr.Next()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("sandbox agent: the listing was cut: %w", err)
	}
	switch kind {
	case api.FrameJSON:
		left := l.max - l.count
		r, err := decodeListBatch(b, min(left, maxListBatch))
		if err != nil {
			return nil, fmt.Errorf("sandbox agent: bad listing: %w", err)
		}
		if r.Done {
			l.done, l.Truncated = true, r.Truncated
			return nil, io.EOF
		}
		if r.Entries.more {
			if left > maxListBatch {
				return nil, fmt.Errorf("sandbox agent: bad listing: a batch of more than %d entries", maxListBatch)
			}
			// More than asked for: keep the cap, stop the agent.
			l.done, l.Truncated = true, true
			l.Close()
		}
		l.count += len(r.Entries.entries)
		if len(r.Entries.entries) == 0 && l.done {
			return nil, io.EOF
		}
		return r.Entries.entries, nil
	case api.FrameError:
		return nil, decodeAgentError(b)
	}
	return nil, fmt.Errorf("sandbox agent: unexpected frame %d", kind)
}

// FileWatch is a watch in progress: the watches are set when Watch
// returns, and Next returns events until Close or an error.
type FileWatch struct {
	Root api.FileInfo
	agentStream
}

// Watch streams create, write, remove, rename and chmod events under a
// path (recursive: in every subdirectory, including new ones).
func (c *Client) Watch(ctx context.Context, path string, recursive bool) (*FileWatch, error) {
	r, st, fr, stop, err := c.openStream(ctx, OpWatch, &FileRequest{Path: path, Recursive: recursive})
	if err != nil {
		return nil, err
	}
	if r.File == nil {
		stop()
		st.Close()
		return nil, errors.New("sandbox agent: reply without file")
	}
	return &FileWatch{Root: *r.File, agentStream: agentStream{st, fr, stop}}, nil
}

// Next waits for the next event.
func (w *FileWatch) Next() (api.FileEvent, error) {
	var ev api.FileEvent
	kind, b, err := w.fr.Next()
	if err != nil {
		return ev, fmt.Errorf("sandbox agent: the watch ended: %w", err)
	}
	switch kind {
	case api.FrameJSON:
		if err := json.Unmarshal(b, &ev); err != nil {
			return ev, fmt.Errorf("sandbox agent: bad event: %w", err)
		}
		return ev, nil
	case api.FrameError:
		return ev, decodeAgentError(b)
	}
	return ev, fmt.Errorf("sandbox agent: unexpected frame %d", kind)
}
