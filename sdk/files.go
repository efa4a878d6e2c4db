package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"strconv"

	"github.com/nookhq/nook/api"
)

// The file API. Paths are absolute paths inside the sandbox. Reads and
// writes stream: nothing here holds a whole file in memory.

// FileMode formats an fs.FileMode's permission, setuid, setgid and sticky
// bits as the API's octal mode string (e.g. "0755", "4755").
func FileMode(m fs.FileMode) string { return fmt.Sprintf("%04o", api.ModeBits(m)) }

func filesPath(name, op string, q url.Values) string {
	p := "/v1/sandboxes/" + esc(name) + "/files"
	if op != "" {
		p += "/" + op
	}
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return p
}

// bodyError is an error reading the caller's upload; it is reported as is.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

type bodyReader struct{ r io.Reader }

func (b bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = &bodyError{err}
	}
	return n, err
}

// StatFile describes a path in a sandbox (a symlink itself, not its target).
func (c *Client) StatFile(ctx context.Context, name, path string) (*api.FileInfo, error) {
	var out api.FileInfo
	return &out, c.call(ctx, "GET", filesPath(name, "stat", url.Values{"path": {path}}), nil, &out)
}

// ListOptions tune ListFiles.
type ListOptions struct {
	Recursive  bool // the whole tree, depth first
	MaxEntries int  // at most this many entries (0: the daemon's default, 10000)
}

// ListFiles lists a directory, or describes a single file. Truncated in
// the answer says that MaxEntries cut the listing.
func (c *Client) ListFiles(ctx context.Context, name, path string, opt ListOptions) (*api.FileList, error) {
	q := url.Values{"path": {path}}
	if opt.Recursive {
		q.Set("recursive", "true")
	}
	if opt.MaxEntries > 0 {
		q.Set("max_entries", strconv.Itoa(opt.MaxEntries))
	}
	var out api.FileList
	return &out, c.call(ctx, "GET", filesPath(name, "list", q), nil, &out)
}

// ReadOptions select part of a file.
type ReadOptions struct {
	Offset int64 // first byte
	Length int64 // bytes to read; 0: to the end
}

// streamBody reads a download. A transfer the daemon cut ends with an
// error, never with a clean EOF.
type streamBody struct {
	body io.ReadCloser
	what string
}

func (s *streamBody) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%s: the transfer was cut: %w", s.what, err)
	}
	return n, err
}

func (s *streamBody) Close() error { return s.body.Close() }

// ReadFile opens a file in a sandbox for reading; the caller reads it to
// io.EOF (any other error means the transfer was cut) and closes it.
func (c *Client) ReadFile(ctx context.Context, name, path string, opt *ReadOptions) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if opt != nil && opt.Offset > 0 {
		q.Set("offset", strconv.FormatInt(opt.Offset, 10))
	}
	if opt != nil && opt.Length > 0 {
		q.Set("length", strconv.FormatInt(opt.Length, 10))
	}
	resp, err := c.do(ctx, "GET", filesPath(name, "content", q), nil)
	if err != nil {
		return nil, err
	}
	return &streamBody{body: resp.Body, what: "read " + name + ":" + path}, nil
}

// WriteOptions tune WriteFile.
type WriteOptions struct {
	Mode    fs.FileMode // permission bits; 0: keep an existing file's, 0644 for a new one
	Parents bool        // create missing parent directories
}

// WriteFile writes what r holds to a file in a sandbox, streaming it. The
// file is replaced atomically once r reaches io.EOF; if r fails, the
// upload is abandoned and the file is left as it was.
func (c *Client) WriteFile(ctx context.Context, name, path string, r io.Reader, opt *WriteOptions) (*api.FileInfo, error) {
	q := url.Values{"path": {path}}
	if opt != nil && opt.Mode != 0 {
		q.Set("mode", FileMode(opt.Mode))
	}
	if opt != nil && opt.Parents {
		q.Set("parents", "true")
	}
	resp, err := c.send(ctx, "PUT", filesPath(name, "content", q), "application/octet-stream", bodyReader{r})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out api.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("write %s:%s: decode response: %w", name, path, err)
	}
	return &out, nil
}

// Mkdir creates a directory; with parents, also its missing parents (and
// an existing directory is fine). mode 0 means 0755.
func (c *Client) Mkdir(ctx context.Context, name, path string, parents bool, mode fs.FileMode) (*api.FileInfo, error) {
	req := api.MkdirRequest{Path: path, Parents: parents}
	if mode != 0 {
		req.Mode = FileMode(mode)
	}
	var out api.FileInfo
	return &out, c.call(ctx, "POST", filesPath(name, "mkdir", nil), req, &out)
}

// RemoveFile removes a file or an empty directory; with recursive, a whole tree.
func (c *Client) RemoveFile(ctx context.Context, name, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.call(ctx, "DELETE", filesPath(name, "", q), nil, nil)
}

// MoveFile renames a file or directory in a sandbox. An existing
// destination is an error unless overwrite.
func (c *Client) MoveFile(ctx context.Context, name, from, to string, overwrite bool) (*api.FileInfo, error) {
	var out api.FileInfo
	return &out, c.call(ctx, "POST", filesPath(name, "move", nil), api.MoveRequest{From: from, To: to, Overwrite: overwrite}, &out)
}

// Chmod sets a path's permission bits.
func (c *Client) Chmod(ctx context.Context, name, path string, mode fs.FileMode) (*api.FileInfo, error) {
	var out api.FileInfo
	return &out, c.call(ctx, "POST", filesPath(name, "chmod", nil), api.ChmodRequest{Path: path, Mode: FileMode(mode)}, &out)
}

// DownloadArchive streams a tar of a file or directory tree in a sandbox.
// Its top entry is the path's base name ("." for /). The caller reads it
// to io.EOF and closes it.
func (c *Client) DownloadArchive(ctx context.Context, name, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, "GET", filesPath(name, "archive", url.Values{"path": {path}}), nil)
	if err != nil {
		return nil, err
	}
	return &streamBody{body: resp.Body, what: "download " + name + ":" + path}, nil
}

// UploadArchive extracts a tar stream into a directory of a sandbox
// (created, with its parents, if parents is set). No entry can land
// outside the directory.
func (c *Client) UploadArchive(ctx context.Context, name, dir string, r io.Reader, parents bool) (*api.FileInfo, error) {
	q := url.Values{"path": {dir}}
	if parents {
		q.Set("parents", "true")
	}
	resp, err := c.send(ctx, "PUT", filesPath(name, "archive", q), "application/x-tar", bodyReader{r})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out api.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("upload to %s:%s: decode response: %w", name, dir, err)
	}
	return &out, nil
}

// FileWatcher streams file events; the watch is in place when WatchFiles returns.
type FileWatcher struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	ctx  context.Context
}

// WatchFiles watches a path in a sandbox for create, write, remove,
// rename and chmod events (recursive: in its whole tree, new
// subdirectories included). Cancel ctx or Close to stop.
func (c *Client) WatchFiles(ctx context.Context, name, path string, recursive bool) (*FileWatcher, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.do(ctx, "GET", filesPath(name, "watch", q), nil)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	return &FileWatcher{body: resp.Body, sc: sc, ctx: ctx}, nil
}

// Next waits for the next event.
func (w *FileWatcher) Next() (*api.FileEvent, error) {
	if !w.sc.Scan() {
		if w.ctx.Err() != nil {
			return nil, w.ctx.Err()
		}
		err := w.sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("the watch ended: %w", err)
	}
	var ev api.FileEvent
	if err := json.Unmarshal(w.sc.Bytes(), &ev); err != nil {
		return nil, fmt.Errorf("bad watch event: %w", err)
	}
	return &ev, nil
}

// Close stops the watch.
func (w *FileWatcher) Close() error { return w.body.Close() }
