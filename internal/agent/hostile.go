package agent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/nookhq/nook/api"
)

// The daemon's defences against its agent. The agent runs inside the
// sandbox, where a user (or whatever the user runs) may have replaced,
// stopped or traced it: everything it sends is untrusted, and it must
// neither grow the daemon's memory nor hang its calls.
//
//   - One frame is at most api.MaxFramePayload; a reply's JSON decodes to
//     at most a bounded number of list elements (listings, process lists),
//     so a frame cannot expand into many times its size; error messages
//     are cut to maxAgentErrorBytes.
//   - A listing ends at the entries asked for, whatever the agent sends.
//   - A stream the agent opens, or a ping it sends, ends the session: a
//     real agent never does either, and each would cost the daemon memory
//     (a stream's receive buffer, a goroutine per ping answer).
//   - Each stream has at most clientWindow bytes in flight, so a flood
//     waits for its reader.
//   - Waits are bounded by the answer timeout (see Client).

// Bounds of what the daemon decodes from the agent.
const (
	maxAgentErrorBytes = 4 << 10
	maxListBatch       = 4096  // entries in one listing batch (the agent sends at most about 1025)
	maxProcessList     = 16384 // sessions in a process list
	clientWindow       = 1 << 20
)

// clientConfig is the daemon's side of the yamux session.
func clientConfig(timeout time.Duration) *yamux.Config {
	cfg := yamuxConfig()
	cfg.MaxStreamWindowSize = clientWindow
	// A ping (the liveness probe) and a write to the connection fail
	// after this long; the probe's failure is how a wedged agent shows.
	cfg.ConnectionWriteTimeout = timeout
	return cfg
}

// clientSession is the daemon's yamux session to an agent, with the liveness
// probe: while streams are open it pings the agent every half answer
// timeout, and an unanswered ping fails the session.
type clientSession struct {
	*yamux.Session
	timeout time.Duration
	failed  atomic.Pointer[NoAnswerError]
	// background and quiet count this session's open streams that are no
	// request in flight (Client.open), guarded by the Client's mu: kept
	// per session, so that streams left on a dead session do not hide a
	// new session's.
	background, quiet int
}

func newSession(conn net.Conn, timeout time.Duration) (*clientSession, error) {
	ys, err := yamux.Client(&guardedConn{Conn: conn}, clientConfig(timeout))
	if err != nil {
		return nil, err
	}
	s := &clientSession{Session: ys, timeout: timeout}
	go s.probe()
	return s, nil
}

// failure returns the *NoAnswerError that closed the session, or nil.
func (s *clientSession) failure() error {
	if e := s.failed.Load(); e != nil {
		return e
	}
	return nil
}

func (s *clientSession) probe() {
	t := time.NewTicker(s.timeout / 2)
	defer t.Stop()
	for {
		select {
		case <-s.CloseChan():
			return
		case <-t.C:
		}
		if s.NumStreams() == 0 {
			continue // nothing waits on the agent: a paused sandbox may be quiet
		}
		if _, err := s.Ping(); err != nil {
			if !errors.Is(err, yamux.ErrSessionShutdown) {
				s.failed.Store(&NoAnswerError{After: s.timeout})
				s.Close()
			}
			return
		}
	}
}

// stream is a yamux stream of a session; its errors after the session
// failed its liveness probe are the *NoAnswerError (a read cut by the
// session's end would otherwise look like a clean end of stream).
type stream struct {
	*yamux.Stream
	sess *clientSession
	// closed tells the client the request is over (once), for Quiesce.
	closed func()
}

// Close ends the request: the stream may linger in the session until the
// agent's side closes too, but it no longer counts as in flight.
func (st *stream) Close() error {
	err := st.Stream.Close()
	if st.closed != nil {
		st.closed()
	}
	return err
}

func (st *stream) Read(p []byte) (int, error) {
	n, err := st.Stream.Read(p)
	if err != nil {
		if ferr := st.sess.failure(); ferr != nil {
			err = ferr
		}
	}
	return n, err
}

func (st *stream) Write(p []byte) (int, error) {
	n, err := st.Stream.Write(p)
	if err != nil {
		if ferr := st.sess.failure(); ferr != nil {
			err = ferr
		}
	}
	return n, err
}

// ErrAgentProtocol is what the session ends with when the agent opens a
// stream or pings the daemon.
var ErrAgentProtocol = errors.New("sandbox agent broke the protocol")

// yamux's header (spec.md of hashicorp/yamux): version, type, flags,
// stream ID, length; a data frame's payload follows.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
	yamuxTypeWindow = 1
	yamuxTypePing   = 2
	yamuxFlagSYN    = 1
)

// frameGuard follows the yamux frames the agent sends and refuses the
// ones a real agent never sends: a SYN (a stream opened toward the
// daemon, or a ping). Everything else passes to yamux, which checks the
// rest (versions, windows).
type frameGuard struct {
	hdr  [yamuxHeaderSize]byte
	have int    // header bytes seen
	skip uint32 // payload bytes of the current data frame still to pass
	err  error
}

// check follows p, the next bytes from the agent, and returns how many
// of them may pass, and the error that stops the rest.
func (g *frameGuard) check(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	i := 0
	for i < len(p) {
		if g.skip > 0 {
			n := min(uint32(len(p)-i), g.skip)
			g.skip -= n
			i += int(n)
			continue
		}
		n := copy(g.hdr[g.have:], p[i:])
		g.have += n
		if g.have < yamuxHeaderSize {
			return len(p), nil
		}
		g.have = 0
		typ, flags := g.hdr[1], binary.BigEndian.Uint16(g.hdr[2:4])
		switch {
		case typ == yamuxTypePing && flags&yamuxFlagSYN != 0:
			g.err = fmt.Errorf("%w: it pinged the daemon", ErrAgentProtocol)
		case (typ == yamuxTypeData || typ == yamuxTypeWindow) && flags&yamuxFlagSYN != 0:
			g.err = fmt.Errorf("%w: it opened a stream toward the daemon", ErrAgentProtocol)
		}
		if g.err != nil {
			return i, g.err // the bytes before this header pass
		}
		i += n
		if typ == yamuxTypeData {
			g.skip = binary.BigEndian.Uint32(g.hdr[8:12])
		}
	}
	return len(p), nil
}

// guardedConn is the agent's connection as the daemon's yamux reads it:
// through a frameGuard.
type guardedConn struct {
	net.Conn
	guard frameGuard // yamux's one reader owns it
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if c.guard.err != nil {
		return 0, c.guard.err
	}
	n, err := c.Conn.Read(p)
	ok, gerr := c.guard.check(p[:n])
	if gerr != nil {
		c.Conn.Close()
		if ok > 0 {
			return ok, nil // the next Read returns the error
		}
		return 0, gerr
	}
	return n, err
}

// decodeArray decodes the JSON array data (or null) into at most max
// elements; more reports that it held more (which are not decoded).
func decodeArray[T any](data []byte, max int) (out []T, more bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, false, err
	}
	if tok == nil {
		return nil, false, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, false, errors.New("not a JSON array")
	}
	for dec.More() {
		if len(out) >= max {
			return out, true, nil
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			return nil, false, err
		}
		out = append(out, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, false, err
	}
	return out, false, nil
}

// processList is a process list of at most maxProcessList sessions.
type processList []ProcessInfo

func (l *processList) UnmarshalJSON(data []byte) error {
	out, more, err := decodeArray[ProcessInfo](data, maxProcessList)
	if err != nil {
		return err
	}
	if more {
		return fmt.Errorf("more than %d processes", maxProcessList)
	}
	*l = out
	return nil
}

// boundedFiles decodes the entries of a listing batch, at most max.
type boundedFiles struct {
	max     int
	entries []api.FileInfo
	more    bool
}

func (b *boundedFiles) UnmarshalJSON(data []byte) error {
	var err error
	b.entries, b.more, err = decodeArray[api.FileInfo](data, b.max)
	return err
}

// listBatch is a listing frame (a FileReply) decoded with at most max entries.
type listBatch struct {
	Entries   *boundedFiles `json:"entries"`
	Done      bool          `json:"done"`
	Truncated bool          `json:"truncated"`
}

func decodeListBatch(b []byte, max int) (*listBatch, error) {
	r := &listBatch{Entries: &boundedFiles{max: max}}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, err
	}
	if r.Entries == nil { // "entries": null
		r.Entries = &boundedFiles{}
	}
	return r, nil
}

// decodeAgentError decodes a FrameError's payload, its message cut to
// maxAgentErrorBytes.
func decodeAgentError(b []byte) error {
	var e api.Error
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("sandbox agent: bad error reply: %w", err)
	}
	return &AgentError{Code: cut(e.Code, 64), Message: cut(e.Message, maxAgentErrorBytes)}
}

// cut shortens s to at most n bytes of valid UTF-8.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
