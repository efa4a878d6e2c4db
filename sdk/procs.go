package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/nookhq/nook/api"
)

// Start starts a command in the background and returns its PID. It
// survives this client; read its output with Output or Attach.
func (c *Client) Start(ctx context.Context, name string, req api.ExecRequest) (int, error) {
	req.Background = true
	var out api.StartedProcess
	return out.PID, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/exec", req, &out)
}

// Processes lists the commands started through nook in a sandbox.
func (c *Client) Processes(ctx context.Context, name string) ([]api.Process, error) {
	var out []api.Process
	return out, c.call(ctx, "GET", "/v1/sandboxes/"+esc(name)+"/processes", nil, &out)
}

// Signal sends a signal (e.g. "TERM") to a process's group.
func (c *Client) Signal(ctx context.Context, name string, pid int, sig string) error {
	return c.call(ctx, "POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", esc(name), pid), api.SignalRequest{Signal: sig}, nil)
}

// Output copies a process's output from a byte offset to stdout and
// stderr until it exits, and returns its exit status. Canceling ctx
// detaches; the process goes on.
func (c *Client) Output(ctx context.Context, name string, pid int, offset int64, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	resp, err := c.do(ctx, "GET", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/output?offset=%d", esc(name), pid, offset), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readStream(ctx, name, resp.Body, stdout, stderr)
}

// Session is an interactive command or an attached process over a
// WebSocket: write its stdin, resize its terminal, signal it, and read its
// output frames until the exit.
type Session struct {
	conn *websocket.Conn
	ctx  context.Context
	wmu  sync.Mutex
	buf  bytes.Buffer
}

// ExecInteractive starts a command with stdin (and a terminal if req.TTY).
func (c *Client) ExecInteractive(ctx context.Context, name string, req api.ExecRequest) (*Session, error) {
	s, err := c.dialWS(ctx, "/v1/sandboxes/"+esc(name)+"/exec/ws")
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(req)
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		s.conn.CloseNow()
		return nil, err
	}
	return s, nil
}

// Attach attaches to a process with input, from a byte offset of its output.
// Closing the session detaches.
func (c *Client) Attach(ctx context.Context, name string, pid int, offset int64) (*Session, error) {
	return c.dialWS(ctx, fmt.Sprintf("/v1/sandboxes/%s/processes/%d/attach?offset=%d", esc(name), pid, offset))
}

func (c *Client) dialWS(ctx context.Context, path string) (*Session, error) {
	u := strings.Replace(c.base, "http", "ws", 1) + path
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			var eb api.ErrorBody
			if json.NewDecoder(resp.Body).Decode(&eb) == nil && eb.Error.Code != "" {
				return nil, &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: resp.Header.Get("X-Request-Id")}
			}
		}
		var ne net.Error
		if resp == nil && !isCtx(ctx) && (asNetErr(err, &ne)) {
			return nil, &UnreachableError{Host: c.host, Err: err}
		}
		return nil, err
	}
	conn.SetReadLimit(api.MaxFramePayload + api.FrameHeaderSize)
	return &Session{conn: conn, ctx: ctx}, nil
}

func isCtx(ctx context.Context) bool { return ctx.Err() != nil }

func asNetErr(err error, target *net.Error) bool {
	for e := err; e != nil; {
		if ne, ok := e.(net.Error); ok {
			*target = ne
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

func (s *Session) send(kind byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.buf.Reset()
	if err := api.WriteFrame(&s.buf, kind, p); err != nil {
		return err
	}
	return s.conn.Write(s.ctx, websocket.MessageBinary, s.buf.Bytes())
}

// stdinChunk is the largest stdin frame sent: small enough that several
// are in flight within the daemon's flow-control window.
const stdinChunk = 256 << 10

// Write sends bytes to the command's stdin or terminal.
func (s *Session) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += stdinChunk {
		end := min(off+stdinChunk, len(p))
		if err := s.send(api.FrameStdin, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// CloseStdin ends the command's input.
func (s *Session) CloseStdin() error { return s.send(api.FrameEOF, nil) }

// Signal sends a signal such as "INT" to the command's group.
func (s *Session) Signal(sig string) error { return s.send(api.FrameSignal, []byte(sig)) }

// Resize sets the command's terminal size.
func (s *Session) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(api.WindowSize{Rows: rows, Cols: cols})
	return s.send(api.FrameResize, b)
}

// Wait copies output to stdout and stderr until the command exits and returns its status.
func (s *Session) Wait(stdout, stderr io.Writer) (*api.ExitStatus, error) {
	for {
		typ, msg, err := s.conn.Read(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil {
				return nil, s.ctx.Err()
			}
			return nil, fmt.Errorf("session ended before the command exited: %w", err)
		}
		if typ != websocket.MessageBinary {
			continue
		}
		st, err := handleFrame(bytes.NewReader(msg), stdout, stderr)
		if err != nil || st != nil {
			return st, err
		}
	}
}

// Close ends the session: an interactive command is killed, an attached process goes on.
func (s *Session) Close() error { return s.conn.Close(websocket.StatusNormalClosure, "") }

// handleFrame reads one frame: output goes to its writer; an exit returns
// its status; an error frame returns an *Error.
func handleFrame(r io.Reader, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	kind, p, err := api.NewFrameReader(r).Next()
	if err != nil {
		return nil, err
	}
	return applyFrame(kind, p, stdout, stderr)
}

func applyFrame(kind byte, p []byte, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	switch kind {
	case api.FrameStdout:
		if stdout != nil {
			if _, err := stdout.Write(p); err != nil {
				return nil, err
			}
		}
	case api.FrameStderr:
		if stderr != nil {
			if _, err := stderr.Write(p); err != nil {
				return nil, err
			}
		}
	case api.FrameExit:
		var st api.ExitStatus
		if err := json.Unmarshal(p, &st); err != nil {
			return nil, fmt.Errorf("bad exit status: %w", err)
		}
		return &st, nil
	case api.FrameError:
		var e api.Error
		json.Unmarshal(p, &e)
		return nil, &Error{Status: http.StatusOK, Code: e.Code, Message: e.Message}
	}
	return nil, nil
}

// readStream reads an exec stream to its exit.
func readStream(ctx context.Context, name string, body io.Reader, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	fr := api.NewFrameReader(body)
	for {
		kind, p, err := fr.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%s: output stream cut: %w", name, err)
		}
		st, err := applyFrame(kind, p, stdout, stderr)
		if err != nil || st != nil {
			return st, err
		}
	}
}
