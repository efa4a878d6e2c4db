package agent

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
)

// VolumeMounter is the guest's side of a vm's volumes: it mounts what a
// VolumesRequest names (nook-agent's guestvol package, with FUSE). The
// Server hands it every volume stream the daemon opens.
type VolumeMounter interface {
	Mount(req *VolumesRequest) error
	Link() *VolLink
}

// SetVolumes makes s serve OpVolumes with v (a vm guest's agent); without
// it, the op is refused.
func (s *Server) SetVolumes(v VolumeMounter) { s.volumes = v }

func (s *Server) serveVolumes(st net.Conn, fr *api.FrameReader, fw *frameWriter, req *VolumesRequest) {
	if s.volumes == nil {
		fw.fail(CodeInvalidArgument, "volumes are mounted this way only in a vm")
		return
	}
	if err := s.volumes.Mount(req); err != nil {
		fw.fail(CodeInternal, "mount volumes: %v", err)
		return
	}
	if fw.json(api.FrameJSON, Reply{}) != nil {
		return
	}
	s.volumes.Link().serve(st, fr, fw, req.Restored)
}

// VolLink carries the guest's volume calls to the daemon over whichever
// volume stream is open now. A call made while none is (the vm was just
// restored, the daemon restarts) waits for the next one, up to
// volLinkWait; a call whose stream ends before its result is sent again,
// unless the next stream says the vm was restored from a snapshot (then
// it fails: it was the snapshot's).
type VolLink struct {
	mu     sync.Mutex
	cur    *volStream
	ready  chan struct{} // closed when cur is set
	nextID uint64
	// epoch counts restores; a call made in an epoch before failBefore
	// was in flight in a snapshot the vm was restored from.
	epoch, failBefore uint64
}

// ErrVolumeCallStale is the error of a call that was in flight when the
// vm's snapshot was taken, found when the vm was restored from it.
var ErrVolumeCallStale = errors.New("the vm was restored from a snapshot taken during this call")

// volLinkWait is how long a call waits for a stream before it fails (EIO):
// the daemon is gone that long.
const volLinkWait = 2 * time.Minute

type volStream struct {
	fw      *frameWriter
	conn    net.Conn
	mu      sync.Mutex
	pending map[uint64]chan volAnswer
	dead    chan struct{}
	once    sync.Once
}

type volAnswer struct {
	res  *VolResult
	data []byte
}

func (s *volStream) kill() {
	s.once.Do(func() {
		s.conn.Close()
		s.mu.Lock()
		close(s.dead)
		s.mu.Unlock()
	})
}

// NewVolLink returns a link with no stream yet.
func NewVolLink() *VolLink { return &VolLink{ready: make(chan struct{})} }

// serve makes st the link's stream (ending the one before, a stale
// session's) and reads results from it until it ends.
func (l *VolLink) serve(st net.Conn, fr *api.FrameReader, fw *frameWriter, restored bool) {
	s := &volStream{fw: fw, conn: st, pending: map[uint64]chan volAnswer{}, dead: make(chan struct{})}
	l.mu.Lock()
	if restored {
		l.epoch++
		l.failBefore = l.epoch
	}
	old := l.cur
	l.cur = s
	if old == nil {
		close(l.ready) // open while there is no stream; closed while there is one
	}
	l.mu.Unlock()
	if old != nil {
		old.kill()
	}
	defer func() {
		s.kill()
		l.drop(s)
	}()
	for {
		kind, p, err := fr.Next()
		if err != nil || kind != api.FrameStdout {
			return
		}
		var res VolResult
		data, err := splitVol(p, &res)
		if err != nil {
			return
		}
		s.mu.Lock()
		ch := s.pending[res.ID]
		delete(s.pending, res.ID)
		s.mu.Unlock()
		if ch != nil {
			ch <- volAnswer{&res, append([]byte(nil), data...)}
		}
	}
}

// ErrVolumeUnreachable is the error of a call that found no stream in volLinkWait.
var ErrVolumeUnreachable = errors.New("the daemon serving this volume is not connected")

// Call sends c (and a write's data) and waits for its result. retried
// reports that it was sent before, on a stream that ended before its
// result came, and sent again: a create, a remove or a rename may then
// have been carried out already. (Waiting for a stream, or finding one
// dead before sending, is no retry.)
func (l *VolLink) Call(ctx context.Context, c *VolCall, data []byte) (res *VolResult, out []byte, retried bool, err error) {
	giveUp := time.NewTimer(volLinkWait)
	defer giveUp.Stop()
	sent := false
	l.mu.Lock()
	epoch := l.epoch
	l.mu.Unlock()
	for {
		l.mu.Lock()
		if epoch < l.failBefore {
			l.mu.Unlock()
			return nil, nil, sent, ErrVolumeCallStale
		}
		s, ready := l.cur, l.ready
		l.nextID++
		id := l.nextID
		l.mu.Unlock()
		if s == nil {
			select {
			case <-ready:
				continue
			case <-giveUp.C:
				return nil, nil, sent, ErrVolumeUnreachable
			case <-ctx.Done():
				return nil, nil, sent, ctx.Err()
			}
		}
		ch := make(chan volAnswer, 1)
		s.mu.Lock()
		select {
		case <-s.dead:
			s.mu.Unlock()
			l.drop(s)
			continue
		default:
		}
		s.pending[id] = ch
		s.mu.Unlock()
		call := *c
		call.ID = id
		b, err := encodeVol(&call, data)
		if err != nil {
			return nil, nil, false, err
		}
		if s.fw.write(api.FrameStdout, b) != nil {
			// Maybe partly written: the daemon may have it.
			sent = true
			s.kill()
			l.drop(s)
			continue
		}
		retried := sent
		sent = true
		select {
		case a := <-ch:
			return a.res, a.data, retried, nil
		case <-s.dead:
			select {
			case a := <-ch: // answered just before the stream ended
				return a.res, a.data, retried, nil
			default:
			}
			l.drop(s)
		case <-ctx.Done():
			s.mu.Lock()
			delete(s.pending, id)
			s.mu.Unlock()
			return nil, nil, retried, ctx.Err()
		}
	}
}

// drop forgets s as the current stream once it is dead.
func (l *VolLink) drop(s *volStream) {
	l.mu.Lock()
	if l.cur == s {
		l.cur = nil
		l.ready = make(chan struct{})
	}
	l.mu.Unlock()
}

// Errno returns the error of a result, or of a call that got none.
func (r *VolResult) errno() syscall.Errno { return syscall.Errno(r.Errno) }

// CallErrno is Call for callers that want an errno: a call that could not
// reach the daemon is EIO (ETIMEDOUT would invite retries that the wait
// already made), one canceled is EINTR.
func (l *VolLink) CallErrno(ctx context.Context, c *VolCall, data []byte) (*VolResult, []byte, bool, syscall.Errno) {
	res, out, retried, err := l.Call(ctx, c, data)
	switch {
	case err == nil:
		return res, out, retried, res.errno()
	case ctx.Err() != nil:
		return nil, nil, retried, syscall.EINTR
	default:
		return nil, nil, retried, syscall.EIO
	}
}
