package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/nookhq/nook/api"
)

// Dialer opens a fresh byte stream to an agent.
type Dialer func(ctx context.Context) (net.Conn, error)

// Client is the daemon side of the protocol for one sandbox. It keeps one
// yamux session and dials again when the session is gone (the agent
// restarted, or the daemon did).
//
// The agent runs inside the sandbox, so the client trusts nothing it
// sends (see hostile.go): frames are bounded, listings stop at their cap,
// a stream or a ping the agent opens ends the session, and every wait
// for the agent is bounded by the answer timeout. A request's first
// answer (and the whole answer of a quick op) must come within it (a
// remove or a move, which may take long, get 20 times as long); while
// a stream is open, a quiet stream (a command that prints nothing) is
// fine as long as the agent answers the session's pings within it. An
// agent that does not (its PID 1 stopped or traced) fails every waiting
// call with a *NoAnswerError and its session is closed.
type Client struct {
	dial    Dialer
	timeout time.Duration // the answer timeout; see SetAnswerTimeout

	mu   sync.Mutex
	sess *clientSession
	hold chan struct{} // closed when a Quiesce is released; new requests wait for it
	// opening counts streams being opened (not yet in NumStreams), which
	// a Quiesce must not cut off either.
	opening int
	// inflight counts the streams open() returned that are not closed yet:
	// requests in flight.
	inflight int
	// dialing is closed when the dial under way (if any) ends.
	dialing chan struct{}
	// gen counts Closes: a dial that began before one drops what it
	// brings. retired: Retire was called; the client connects no more.
	gen     int
	retired bool
}

// DefaultAnswerTimeout is how long the agent may take to answer a
// request or a ping before the call fails with a *NoAnswerError.
const DefaultAnswerTimeout = 30 * time.Second

// NewClient returns a Client that dials with d on first use.
func NewClient(d Dialer) *Client { return &Client{dial: d, timeout: DefaultAnswerTimeout} }

// SetAnswerTimeout sets how long the agent may take to answer (see
// Client); d <= 0 restores DefaultAnswerTimeout. Call it before the
// first request.
func (c *Client) SetAnswerTimeout(d time.Duration) *Client {
	if d <= 0 {
		d = DefaultAnswerTimeout
	}
	c.timeout = d
	return c
}

// Close closes the session; running execs are cut off.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeLocked()
}

// Retire closes the client for good: a request on it fails, and a dial
// under way drops the connection it makes. The daemon retires the client
// of a sandbox that stopped or restarted: a connection left open by a
// caller still holding it would hold a vm's agent port (one connection
// at a time) from the client that replaces it.
func (c *Client) Retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
	c.closeLocked()
}

func (c *Client) closeLocked() error {
	// A dial under way when the client closes drops what it brings: what
	// was connected before a Close is not connected after it.
	c.gen++
	if c.sess != nil {
		err := c.sess.Close()
		c.sess = nil
		return err
	}
	return nil
}

// Quiesce closes the session and makes new requests wait until release,
// so that nothing of the host's is connected to the agent (a container's
// memory snapshot cannot save a connection whose other end is the
// daemon). It refuses (ok false, nothing changed) while requests are
// open: execs, attaches and transfers in flight are never cut off.
func (c *Client) Quiesce() (release func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil && !c.sess.IsClosed() {
		// Requests in flight, not the session's streams: a stream the
		// daemon closed stays there until the agent's close arrives.
		// Quiet streams (an SSH session, a preview's connection) are not
		// cut off either.
		if c.inflight > 0 || c.opening > 0 || c.sess.quiet > 0 {
			return nil, false
		}
		c.sess.Close()
	}
	c.sess = nil
	hold := make(chan struct{})
	c.hold = hold
	return sync.OnceFunc(func() {
		c.mu.Lock()
		if c.hold == hold {
			c.hold = nil
		}
		c.mu.Unlock()
		close(hold)
	}), true
}

// Streams returns how many requests to the agent are open now (execs,
// attaches, transfers, watches), without connecting if the client is not.
func (c *Client) Streams() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil || c.sess.IsClosed() {
		return 0
	}
	return max(0, c.sess.NumStreams()-c.sess.background-c.sess.quiet)
}

// AgentError is an error the agent reported (e.g. command not found).
type AgentError struct {
	Code    string
	Message string
}

func (e *AgentError) Error() string { return e.Message }

// NoAnswerError reports an agent that did not answer in time: a request
// it left unanswered, or a session that stopped answering pings.
type NoAnswerError struct {
	After time.Duration
}

func (e *NoAnswerError) Error() string {
	return fmt.Sprintf("the sandbox agent did not answer within %s (is the sandbox's PID 1 stopped or traced?)", e.After)
}

// Timeout reports true: a NoAnswerError is a timeout (net.Error).
func (e *NoAnswerError) Timeout() bool { return true }

// Temporary reports true: the agent may answer again (net.Error).
func (e *NoAnswerError) Temporary() bool { return true }

// Kinds of streams Client.open counts.
type streamKind int

const (
	// streamRequest: a request in flight (Streams counts it, Quiesce
	// waits for it).
	streamRequest streamKind = iota
	// streamBackground: no request in flight (a vm's volume stream,
	// ServeVolumes): Streams leaves it out, Quiesce cuts it.
	streamBackground
	// streamQuiet: a Quiet context's (an SSH session, a preview's
	// connection): Streams leaves it out, Quiesce does not cut it.
	streamQuiet
)

func (c *Client) open(ctx context.Context, kind streamKind) (net.Conn, error) {
	for attempt := 0; attempt < 2; attempt++ {
		sess, err := c.session(ctx)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.opening++
		c.mu.Unlock()
		st, err := sess.OpenStream()
		c.mu.Lock()
		c.opening--
		c.mu.Unlock()
		if err == nil {
			count := &c.inflight
			switch kind {
			case streamBackground:
				count = &sess.background
			case streamQuiet:
				count = &sess.quiet
			}
			c.mu.Lock()
			*count++
			c.mu.Unlock()
			return &stream{Stream: st, sess: sess, closed: sync.OnceFunc(func() {
				c.mu.Lock()
				*count--
				c.mu.Unlock()
			})}, nil
		}
		sess.Close()
		if ferr := sess.failure(); ferr != nil {
			return nil, ferr // wedged: dialing again would not help now
		}
	}
	return nil, errors.New("connect to sandbox agent: session keeps closing")
}

// session returns the live session, dialing one if there is none. The
// dial (which, for a vm whose agent does not answer, lasts as long as
// ctx) runs without c.mu, one at a time: other callers wait for it only
// as long as their own ctx allows, and Streams, Quiesce and Close never
// wait for it.
func (c *Client) session(ctx context.Context) (*clientSession, error) {
	c.mu.Lock()
	for {
		var wait chan struct{}
		switch {
		case c.hold != nil: // quiesced: nothing connects until released
			wait = c.hold
		case c.sess != nil && !c.sess.IsClosed():
			sess := c.sess
			c.mu.Unlock()
			return sess, nil
		case c.dialing != nil: // another caller's dial: its session is ours
			wait = c.dialing
		}
		if wait == nil {
			break
		}
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to sandbox agent: %w", ctx.Err())
		}
		c.mu.Lock()
	}
	if c.retired {
		c.mu.Unlock()
		return nil, errClientClosed
	}
	gen := c.gen
	dialing := make(chan struct{})
	c.dialing = dialing
	c.mu.Unlock()
	conn, err := c.dial(ctx)
	var sess *clientSession
	if err != nil {
		err = fmt.Errorf("connect to sandbox agent: %w", err)
	} else if sess, err = newSession(conn, c.timeout); err != nil {
		conn.Close()
	}
	c.mu.Lock()
	c.dialing = nil
	close(dialing)
	if err == nil && (c.retired || c.gen != gen) {
		sess.Close()
		c.mu.Unlock()
		return nil, errClientClosed
	}
	if err == nil && c.hold != nil {
		// Quiesced meanwhile: nothing may be connected until released.
		sess.Close()
		c.mu.Unlock()
		return c.session(ctx)
	}
	if err == nil {
		c.sess = sess
	}
	c.mu.Unlock()
	return sess, err
}

// errClientClosed: the client was closed while the request connected, or
// retired (its sandbox stopped, restarted or went).
var errClientClosed = errors.New("connect to sandbox agent: the connection was closed (the sandbox stopped or restarted): try again")

// How long a request waits for its first answer.
type wait int

const (
	// quick: the answer is due within the answer timeout.
	quick wait = iota
	// patient: the op may take long (a recursive remove, a move that
	// copies); it waits patientFactor answer timeouts (10 minutes by
	// default), and only as long as the agent answers the session's pings.
	patient
	// background: quick, and the stream it opens is no request in flight
	// (streamBackground).
	background
)

const patientFactor = 20

type quietKey struct{}

// Quiet marks the streams requests under ctx open as no request in
// flight: Streams leaves them out (an SSH session or a kept-alive preview
// connection, whose traffic its owner reports instead).
func Quiet(ctx context.Context) context.Context { return context.WithValue(ctx, quietKey{}, true) }

// IsQuiet says whether ctx was marked Quiet.
func IsQuiet(ctx context.Context) bool { return quiet(ctx) }

func quiet(ctx context.Context) bool {
	v, _ := ctx.Value(quietKey{}).(bool)
	return v
}

// request opens a stream, sends req and reads the first reply frame into reply.
func (c *Client) request(ctx context.Context, req Request, reply any) (net.Conn, *api.FrameReader, error) {
	return c.requestWait(ctx, req, reply, quick)
}

func (c *Client) requestWait(ctx context.Context, req Request, reply any, w wait) (net.Conn, *api.FrameReader, error) {
	sk := streamRequest
	switch {
	case w == background:
		sk = streamBackground
	case quiet(ctx):
		sk = streamQuiet
	}
	st, err := c.open(ctx, sk)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { abort(st) })
	b, _ := json.Marshal(req)
	fr := api.NewFrameReader(st)
	// The request itself must get through in time (a wedged agent
	// leaves its window shut), and a quick op's answer too.
	st.SetWriteDeadline(time.Now().Add(c.timeout))
	answerBy := c.timeout
	if w == patient {
		answerBy *= patientFactor
	}
	st.SetReadDeadline(time.Now().Add(answerBy))
	err = api.WriteFrame(st, api.FrameJSON, b)
	var kind byte
	var p []byte
	if err == nil {
		kind, p, err = fr.Next()
	}
	if !stop() && err == nil {
		err = ctx.Err() // canceled after the reply arrived: the stream is aborted
	}
	if err != nil {
		abort(st)
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		var na *NoAnswerError
		if errors.As(err, &na) {
			return nil, nil, na
		}
		if errors.Is(err, yamux.ErrTimeout) {
			return nil, nil, &NoAnswerError{After: answerBy}
		}
		return nil, nil, fmt.Errorf("sandbox agent: %w", err)
	}
	st.SetDeadline(time.Time{})
	switch kind {
	case api.FrameJSON:
		if err := json.Unmarshal(p, reply); err != nil {
			st.Close()
			return nil, nil, fmt.Errorf("sandbox agent: bad reply: %w", err)
		}
		return st, fr, nil
	case api.FrameError:
		st.Close()
		return nil, nil, decodeAgentError(p)
	default:
		st.Close()
		return nil, nil, fmt.Errorf("sandbox agent: unexpected frame %d", kind)
	}
}

// Ping checks that the agent answers, and returns what it says about the sandbox.
func (c *Client) Ping(ctx context.Context) (*Reply, error) {
	var r Reply
	st, _, err := c.request(ctx, Request{Op: OpPing}, &r)
	if err != nil {
		return nil, err
	}
	st.Close()
	return &r, nil
}

// Configure gives the sandbox its identity (see ConfigureRequest).
func (c *Client) Configure(ctx context.Context, req *ConfigureRequest) error {
	var r Reply
	st, _, err := c.request(ctx, Request{Op: OpConfigure, Configure: req}, &r)
	if err != nil {
		return err
	}
	return st.Close()
}

// Start starts a background session and returns its PID.
func (c *Client) Start(ctx context.Context, req *ExecRequest) (int, error) {
	r := *req
	r.Background = true
	var reply Reply
	st, _, err := c.request(ctx, Request{Op: OpExec, Exec: &r}, &reply)
	if err != nil {
		return 0, err
	}
	st.Close()
	return reply.PID, nil
}

// Processes lists the sessions started through nook (running and recently finished).
func (c *Client) Processes(ctx context.Context) ([]ProcessInfo, error) {
	var out processList
	st, _, err := c.request(ctx, Request{Op: OpProcesses}, &out)
	if err != nil {
		return nil, err
	}
	st.Close()
	return out, nil
}

// Attach follows a session's output from an offset; read it with Next to
// its FrameExit. With Input, Write, CloseStdin, Signal and Resize reach the
// session. Closing detaches; the session goes on.
func (c *Client) Attach(ctx context.Context, req *AttachRequest) (*Process, error) {
	var r Reply
	st, fr, err := c.request(ctx, Request{Op: OpAttach, Attach: req}, &r)
	if err != nil {
		return nil, err
	}
	return &Process{PID: r.PID, OutputFrom: r.OutputFrom, st: st, fr: fr}, nil
}

// SignalProcess sends a signal (e.g. "TERM") to a session's process group.
func (c *Client) SignalProcess(ctx context.Context, pid int, sig string) error {
	var r Reply
	st, _, err := c.request(ctx, Request{Op: OpSignal, Signal: &SignalRequest{PID: pid, Signal: sig}}, &r)
	if err != nil {
		return err
	}
	return st.Close()
}

// Process is a running exec. Read its output with Next until a FrameExit
// (or an error); Close kills it if it has not exited.
type Process struct {
	PID        int
	OutputFrom int64 // attach: the oldest output offset still kept
	st         net.Conn
	fr         *api.FrameReader
	wmu        sync.Mutex
}

// Exec starts a process. An *AgentError reports why the agent refused.
func (c *Client) Exec(ctx context.Context, req *ExecRequest) (*Process, error) {
	var r Reply
	st, fr, err := c.request(ctx, Request{Op: OpExec, Exec: req}, &r)
	if err != nil {
		return nil, err
	}
	return &Process{PID: r.PID, st: st, fr: fr}, nil
}

// Next returns the next output frame: FrameStdout, FrameStderr, or the final FrameExit.
func (p *Process) Next() (byte, []byte, error) { return p.fr.Next() }

func (p *Process) send(kind byte, b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return api.WriteFrame(p.st, kind, b)
}

// Write sends bytes to the process's stdin (exec with Stdin set).
func (p *Process) Write(b []byte) (int, error) {
	for off := 0; off < len(b); off += api.MaxFramePayload {
		end := min(off+api.MaxFramePayload, len(b))
		if err := p.send(api.FrameStdin, b[off:end]); err != nil {
			return off, err
		}
	}
	return len(b), nil
}

// CloseStdin closes the process's stdin.
func (p *Process) CloseStdin() error { return p.send(api.FrameEOF, nil) }

// Signal sends a signal (e.g. "TERM") to the process's group.
func (p *Process) Signal(name string) error { return p.send(api.FrameSignal, []byte(name)) }

// Resize changes the size of the process's terminal.
func (p *Process) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(api.WindowSize{Rows: rows, Cols: cols})
	return p.send(api.FrameResize, b)
}

// Send forwards one client frame (stdin, eof, signal, resize) as is.
func (p *Process) Send(kind byte, b []byte) error {
	switch kind {
	case api.FrameStdin, api.FrameEOF, api.FrameSignal, api.FrameResize:
		return p.send(kind, b)
	}
	return fmt.Errorf("frame kind %d cannot be sent to a process", kind)
}

// Close ends the stream; a process still running is killed by the agent.
func (p *Process) Close() error { return abort(p.st) }

// abort ends a stream on this side at once. A yamux Close only half-closes
// (a pending Read waits for the peer's FIN, which a paused or hung
// sandbox never sends); the deadline makes pending reads return now.
func abort(st net.Conn) error {
	st.SetDeadline(time.Now())
	return st.Close()
}
