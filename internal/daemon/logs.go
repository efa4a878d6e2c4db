package daemon

import (
	"bytes"
	"context"
	"io"
	"os"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// The sandbox's logs (`nook logs`): its agent's log and its console, as
// its backend keeps them (core.LogOpener). The sandbox writes them, so
// only their end is ever read (maxLogRead) and the bytes go out as they
// are: the CLI escapes them for a terminal.

// maxLogRead bounds how much of a log's end a read returns.
const maxLogRead = 1 << 20

// logPoll is how often a followed log is looked at for more.
const logPoll = 250 * time.Millisecond

// SandboxLog is one sandbox log, to read. Nothing of it stays open
// between reads: a file held open in a container's root would keep the
// root busy, and a stop could then not unmount its disk.
type SandboxLog struct {
	m       *Manager
	sb      *core.Sandbox
	lo      core.LogOpener
	name    string      // core.LogAgent or core.LogConsole
	fi      os.FileInfo // the file as last read
	off     int64
	pending []byte // a line read but not yet ended (follow)
}

// OpenLog finds a sandbox's log: log (core.LogAgent or core.LogConsole),
// or, "", the one its backend keeps what its init and agent write in.
func (m *Manager) OpenLog(ctx context.Context, name, log string) (*SandboxLog, error) {
	sb, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	lo, ok := m.backends[sb.Isolation].(core.LogOpener)
	if !ok {
		return nil, errdefs.Precondition("the %s backend keeps no logs", sb.Isolation)
	}
	if log == "" {
		log = lo.MainLog()
	}
	f, err := lo.OpenLog(sb.ID, log)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		return nil, err
	}
	return &SandboxLog{m: m, sb: sb, lo: lo, name: log, fi: fi}, nil
}

// Name is the log's name (agent or console).
func (l *SandboxLog) Name() string { return l.name }

// Close ends the log's use (nothing is held between reads).
func (l *SandboxLog) Close() error { return nil }

// Copy writes the log's last tail lines (tail < 0: all of its last
// maxLogRead bytes) to w; with follow, it then writes what is added, as
// whole lines, calling flush after each write, until ctx ends or the
// sandbox is gone. A log emptied (a vm's console past its cap) or
// replaced is read again from its start; a log that grew by more than
// maxLogRead since the last look is read from maxLogRead before its end.
// While the log cannot be opened (a stopped container's root is not
// mounted) a follow waits.
func (l *SandboxLog) Copy(ctx context.Context, w io.Writer, tail int, follow bool, flush func()) error {
	buf, err := l.readNew()
	if err != nil {
		return err
	}
	if !follow {
		_, err = w.Write(lastLines(buf, tail))
		return err
	}
	// Following, an unended last line waits for its end.
	if i := bytes.LastIndexByte(buf, '\n'); i+1 < len(buf) {
		l.pending = bytes.Clone(buf[i+1:])
		buf = buf[:i+1]
	}
	if _, err := w.Write(lastLines(buf, tail)); err != nil {
		return err
	}
	flush()
	t := time.NewTicker(logPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !l.current(ctx) {
			if len(l.pending) > 0 {
				w.Write(append(l.pending, '\n'))
			}
			return nil
		}
		data, err := l.readNew()
		if err != nil || len(data) == 0 {
			continue // not there now (a stopped container's root), or nothing new
		}
		data = append(l.pending, data...)
		i := bytes.LastIndexByte(data, '\n')
		if len(data) > maxLogLine && i < 0 {
			i = len(data) - 1 // a line without end, too long to hold: out it goes
		}
		l.pending = bytes.Clone(data[i+1:])
		if i >= 0 {
			if _, err := w.Write(data[:i+1]); err != nil {
				return err
			}
			flush()
		}
	}
}

// readNew opens the log as it is now, reads what it holds past l.off,
// and closes it. A log replaced or emptied since the last read is read
// from its start; of more than maxLogRead bytes only the last maxLogRead
// are read, from the first line that starts in them.
func (l *SandboxLog) readNew() ([]byte, error) {
	f, err := l.lo.OpenLog(l.sb.ID, l.name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !os.SameFile(l.fi, fi) || fi.Size() < l.off {
		l.off, l.pending = 0, nil
	}
	l.fi = fi
	skipped := false
	if fi.Size()-l.off > maxLogRead {
		l.off, l.pending, skipped = fi.Size()-maxLogRead, nil, true
	}
	buf := make([]byte, fi.Size()-l.off)
	n, err := f.ReadAt(buf, l.off)
	if err != nil && err != io.EOF {
		return nil, err
	}
	buf = buf[:n]
	l.off += int64(n)
	if skipped { // a partial first line
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	return buf, nil
}

// maxLogLine bounds a followed line held back for its end.
const maxLogLine = 64 << 10

// current reports whether the sandbox is still there (the same one, not
// being destroyed).
func (l *SandboxLog) current(ctx context.Context) bool {
	sb, err := l.m.store.GetSandbox(ctx, l.sb.Name)
	return err == nil && sb.ID == l.sb.ID && sb.State != core.StateDestroying
}

// lastLines is the last n lines of b (n < 0: all of b).
func lastLines(b []byte, n int) []byte {
	if n < 0 {
		return b
	}
	if n == 0 {
		return nil
	}
	i := len(b)
	if i > 0 && b[i-1] == '\n' {
		i--
	}
	for ; n > 0; n-- {
		j := bytes.LastIndexByte(b[:i], '\n')
		if j < 0 {
			return b
		}
		i = j
	}
	return b[i+1:]
}
