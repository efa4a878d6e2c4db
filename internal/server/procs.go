package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/coder/websocket"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/errdefs"
)

func pathPID(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errdefs.Invalid("process id %q is not valid: use the PID nook ps shows", r.PathValue("pid"))
	}
	return pid, nil
}

// pidOffset reads the {pid} of the path and the offset query parameter.
func pidOffset(r *http.Request) (int, int64, error) {
	pid, err := pathPID(r)
	if err != nil {
		return 0, 0, err
	}
	s := r.URL.Query().Get("offset")
	if s == "" {
		return pid, 0, nil
	}
	off, err := strconv.ParseInt(s, 10, 64)
	if err != nil || off < 0 {
		return 0, 0, errdefs.Invalid("offset %q is not valid: give a byte offset >= 0", s)
	}
	return pid, off, nil
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	ps, err := s.m.Processes(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ps)
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPID(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req api.SignalRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.m.Signal(r.Context(), r.PathValue("name"), pid, req.Signal); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// processOutput streams a process's output from an offset until it
// exits, in the exec stream format. Disconnecting detaches.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) {
	pid, off, err := pidOffset(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := s.m.Attach(r.Context(), r.PathValue("name"), pid, off, false)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.relayStream(w, r, p)
}

// execWebSocket runs a command with stdin and, if asked, a terminal. The
// first message is the ExecRequest as JSON text; then each binary message
// carries one frame: stdin, eof, signal and resize frames from the
// client, stdout, stderr, exit and error frames from the sandbox.
func (s *Server) execWebSocket(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	c.SetReadLimit(api.MaxFramePayload + api.FrameHeaderSize)
	ctx := r.Context()
	typ, msg, err := c.Read(ctx)
	if err != nil {
		return
	}
	var req api.ExecRequest
	dec := json.NewDecoder(bytesReader(msg))
	dec.DisallowUnknownFields()
	if typ != websocket.MessageText || dec.Decode(&req) != nil {
		s.wsFail(ctx, c, errdefs.Invalid("the first message must be an ExecRequest as JSON text"))
		return
	}
	if req.Background {
		s.wsFail(ctx, c, errdefs.Invalid("background commands are started with POST .../exec, not over a WebSocket"))
		return
	}
	req.Stdin = true
	p, err := s.m.Exec(ctx, r.PathValue("name"), req)
	if err != nil {
		s.wsFail(ctx, c, err)
		return
	}
	s.relayWebSocket(ctx, c, p)
}

// attachWebSocket attaches to a process with input; closing detaches.
func (s *Server) attachWebSocket(w http.ResponseWriter, r *http.Request) {
	pid, off, err := pidOffset(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p, err := s.m.Attach(r.Context(), r.PathValue("name"), pid, off, true)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer p.Close()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(api.MaxFramePayload + api.FrameHeaderSize)
	s.relayWebSocket(r.Context(), c, p)
}

func (s *Server) wsFail(ctx context.Context, c *websocket.Conn, err error) {
	_, code := errorStatus(err)
	b, _ := json.Marshal(api.Error{Code: code, Message: err.Error()})
	var buf bytesBuffer
	api.WriteFrame(&buf, api.FrameError, b)
	c.Write(ctx, websocket.MessageBinary, buf.b)
	c.Close(websocket.StatusNormalClosure, "")
}

// relayWebSocket copies frames both ways until the process exits or the client goes.
func (s *Server) relayWebSocket(ctx context.Context, c *websocket.Conn, p *agent.Process) {
	defer p.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer cancel()
		fr := api.NewFrameReader(nil)
		for {
			typ, r, err := c.Reader(ctx)
			if err != nil {
				return
			}
			if typ != websocket.MessageBinary {
				continue
			}
			fr.Reset(r)
			kind, payload, err := fr.Next()
			if err != nil {
				return
			}
			if p.Send(kind, payload) != nil {
				return
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() { p.Close() })
	defer stop()
	var buf bytesBuffer
	for {
		kind, payload, err := p.Next()
		if err != nil {
			if ctx.Err() == nil {
				b, _ := json.Marshal(api.Error{Code: api.CodeUnavailable, Message: streamLost(err)})
				buf.b = buf.b[:0]
				api.WriteFrame(&buf, api.FrameError, b)
				c.Write(ctx, websocket.MessageBinary, buf.b)
			}
			return
		}
		buf.b = buf.b[:0]
		api.WriteFrame(&buf, kind, payload)
		if err := c.Write(ctx, websocket.MessageBinary, buf.b); err != nil {
			return
		}
		if kind == api.FrameExit {
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

// streamLost says why a process's stream ended before its exit.
func streamLost(err error) string {
	var na *agent.NoAnswerError
	if errors.As(err, &na) {
		return fmt.Sprintf("the sandbox's agent stopped answering before the command finished (no answer within %s: is the sandbox's PID 1 stopped or traced?)", na.After)
	}
	return "the connection to the sandbox was lost before the command finished"
}

// relayStream writes a process's frames as an HTTP exec stream.
func (s *Server) relayStream(w http.ResponseWriter, r *http.Request, p *agent.Process) {
	defer p.Close()
	stop := context.AfterFunc(r.Context(), func() { p.Close() })
	defer stop()
	w.Header().Set("Content-Type", api.StreamContentType)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	for {
		kind, payload, err := p.Next()
		if err != nil {
			if r.Context().Err() == nil && !errors.Is(err, context.Canceled) {
				b, _ := json.Marshal(api.Error{Code: api.CodeUnavailable, Message: streamLost(err)})
				api.WriteFrame(w, api.FrameError, b)
			}
			return
		}
		if err := api.WriteFrame(w, kind, payload); err != nil {
			return
		}
		if err := rc.Flush(); err != nil || kind == api.FrameExit {
			return
		}
	}
}
