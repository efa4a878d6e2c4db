package preview

import (
	"container/list"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"
)

// Keep-alive: each (sandbox, port) has its own http.Transport, whose
// idle connections the next request to that port reuses (a dial goes
// through the sandbox's agent, far dearer than a request on an open
// connection).
const (
	maxIdlePerPort  = 16
	idleConnTimeout = 30 * time.Second
	// maxResponseHeader bounds the headers of the sandbox's answers
	// (untrusted): past it the request gets a 502.
	maxResponseHeader = 256 << 10
	// usedEvery throttles the Used calls a busy connection makes.
	usedEvery = time.Second
)

type poolKey struct {
	id   string
	port int
}

type poolEntry struct {
	key  poolKey
	name string
	tr   *http.Transport
	used atomic.Int64 // UnixNano of the last Used call for traffic
}

// pool is the transports, least recently used last.
type pool struct {
	s   *Server
	max int

	mu  sync.Mutex
	m   map[poolKey]*list.Element // of *poolEntry
	lru list.List
}

func (p *pool) init(s *Server, max int) {
	p.s, p.max = s, max
	p.m = make(map[poolKey]*list.Element)
}

// get returns the transport for t, making it on first use.
func (p *pool) get(t *target) *http.Transport {
	key := poolKey{t.id, t.port}
	var victims []*poolEntry
	p.mu.Lock()
	if el, ok := p.m[key]; ok {
		e := el.Value.(*poolEntry)
		if e.name == t.name {
			p.lru.MoveToFront(el)
			p.mu.Unlock()
			return e.tr
		}
		// The sandbox was renamed: dial it by its new name.
		p.lru.Remove(el)
		delete(p.m, key)
		victims = append(victims, e)
	}
	e := p.newEntry(key, t.name)
	p.m[key] = p.lru.PushFront(e)
	for p.lru.Len() > p.max {
		el := p.lru.Back()
		v := el.Value.(*poolEntry)
		p.lru.Remove(el)
		delete(p.m, v.key)
		victims = append(victims, v)
	}
	p.mu.Unlock()
	// Requests under way on a victim finish; its connections then idle
	// out (IdleConnTimeout).
	for _, v := range victims {
		v.tr.CloseIdleConnections()
	}
	return e.tr
}

func (p *pool) newEntry(key poolKey, name string) *poolEntry {
	e := &poolEntry{key: key, name: name}
	sb := p.s.sb
	e.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := sb.DialPort(ctx, name, key.port)
			if err != nil {
				return nil, &dialError{err}
			}
			return &usedConn{Conn: c, sb: sb, e: e}, nil
		},
		MaxIdleConns:           maxIdlePerPort,
		MaxIdleConnsPerHost:    maxIdlePerPort,
		IdleConnTimeout:        idleConnTimeout,
		MaxResponseHeaderBytes: maxResponseHeader,
		ExpectContinueTimeout:  time.Second,
		// Bodies pass as the app sent them: no gzip added, none undone.
		DisableCompression: true,
	}
	return e
}

// closeIdle closes the idle connections to sandbox id's ports (which
// may be dead or frozen once it paused or stopped).
func (p *pool) closeIdle(id string) {
	for _, e := range p.entries(id, false) {
		e.tr.CloseIdleConnections()
	}
}

// entries returns sandbox id's entries (all with id == ""), removed from
// the pool when remove.
func (p *pool) entries(id string, remove bool) []*poolEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var es []*poolEntry
	for key, el := range p.m {
		if id != "" && key.id != id {
			continue
		}
		es = append(es, el.Value.(*poolEntry))
		if remove {
			p.lru.Remove(el)
			delete(p.m, key)
		}
	}
	return es
}

func (p *pool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// Forget drops the kept-alive connections to sandbox id's ports: for the
// daemon to call when it pauses, stops or removes a sandbox.
func (s *Server) Forget(sandboxID string) {
	if sandboxID == "" {
		return
	}
	for _, e := range s.pool.entries(sandboxID, true) {
		e.tr.CloseIdleConnections()
	}
}

// Close closes the kept-alive connections to all sandboxes (requests
// under way go on): for the daemon's shutdown.
func (s *Server) Close() {
	for _, e := range s.pool.entries("", true) {
		e.tr.CloseIdleConnections()
	}
}

// poolTransport sends a request through its target's transport.
type poolTransport struct{ s *Server }

func (p poolTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t := targetOf(r.Context())
	if t == nil {
		return nil, errors.New("preview: a request without a target")
	}
	// A 1xx answer that is not final (103 Early Hints) goes to the
	// client as soon as it comes, before ModifyResponse sees the final
	// one: its Set-Cookie headers are cleaned here, ahead of the proxy's
	// own hook (WithClientTrace calls the newest hooks first).
	r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, h textproto.MIMEHeader) error {
			sanitizeSetCookies(http.Header(h))
			return nil
		},
	}))
	return p.s.pool.get(t).RoundTrip(r)
}

// usedConn is a connection to a sandbox port that tells the daemon the
// sandbox is used while bytes flow (a WebSocket or a stream of events
// may last far longer than its request), at most once per usedEvery.
type usedConn struct {
	net.Conn
	sb Sandboxes
	e  *poolEntry
}

func (c *usedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *usedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *usedConn) touch() {
	now := time.Now().UnixNano()
	last := c.e.used.Load()
	if now-last >= int64(usedEvery) && c.e.used.CompareAndSwap(last, now) {
		c.sb.Used(c.e.key.id)
	}
}
