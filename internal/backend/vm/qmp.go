package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// qmpConn is a client of QEMU's machine protocol (QMP): one command at a
// time, its answer read on the caller's goroutine, asynchronous events
// skipped. (nook used digitalocean/go-qemu's qmp.SocketMonitor before. It
// hands out its scanner's buffer, which its reader goroutine then
// overwrites while the caller decodes it, and may take an event for the
// answer to qmp_capabilities: go-qemu issues #226 and #210, both open.
// QMP is a few lines of JSON; this is the part of it nook speaks.)
type qmpConn struct {
	c      *net.UnixConn
	r      *bufio.Reader
	broken error // after a failed read or write the stream is out of step: no more commands
}

const (
	qmpTimeout = 60 * time.Second // a command's answer (nook's commands return at once)
	qmpMaxLine = 8 << 20          // an answer or event longer than this is refused
)

// qmpDial connects to a QMP socket and leaves the greeting's capability
// negotiation done, within ctx (and 5 s at most).
func qmpDial(ctx context.Context, path string) (*qmpConn, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &qmpConn{c: conn.(*net.UnixConn), r: bufio.NewReaderSize(conn, 64<<10)}
	dl, _ := ctx.Deadline()
	q.c.SetDeadline(dl)
	line, err := q.readLine()
	if err == nil && !bytes.Contains(line, []byte(`"QMP"`)) {
		err = fmt.Errorf("not a QMP greeting: %.200q", line)
	}
	if err == nil {
		_, err = q.command([]byte(`{"execute":"qmp_capabilities"}`), nil, dl)
	}
	if err != nil {
		q.close()
		return nil, fmt.Errorf("QMP handshake: %w", err)
	}
	return q, nil
}

// command sends one command (with f's descriptor, if not nil) and returns
// its "return" value, or its "error" as an error.
func (q *qmpConn) command(cmd []byte, f *os.File, deadline time.Time) (json.RawMessage, error) {
	if q.broken != nil {
		return nil, fmt.Errorf("an earlier command on this connection failed: %w", q.broken)
	}
	fail := func(err error) error {
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET):
			err = fmt.Errorf("QEMU closed its monitor (did it exit?): %w", err)
		}
		q.broken = err
		return err
	}
	q.c.SetDeadline(deadline)
	var err error
	if f != nil {
		_, _, err = q.c.WriteMsgUnix(cmd, syscall.UnixRights(int(f.Fd())), nil)
	} else {
		_, err = q.c.Write(cmd)
	}
	if err != nil {
		return nil, fail(err)
	}
	for {
		line, err := q.readLine()
		if err != nil {
			return nil, fail(err)
		}
		ret, event, err := parseQMP(line)
		if event {
			continue
		}
		return ret, err
	}
}

// parseQMP reads one line QEMU sent: an event (skipped), a command's
// return value, or its error.
func parseQMP(line []byte) (ret json.RawMessage, event bool, err error) {
	var msg struct {
		Event  string          `json:"event"`
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal(line, &msg); err != nil {
		return nil, false, fmt.Errorf("QEMU sent what is not JSON: %.200q", line)
	}
	switch {
	case msg.Event != "":
		return nil, true, nil
	case msg.Error != nil:
		return nil, false, fmt.Errorf("%s: %.500s", msg.Error.Class, msg.Error.Desc)
	case msg.Return == nil:
		return nil, false, fmt.Errorf("QEMU's answer has no return: %.200q", line)
	}
	return msg.Return, false, nil
}

// readLine reads one line of QMP, bounded by qmpMaxLine.
func (q *qmpConn) readLine() ([]byte, error) {
	var line []byte
	for {
		part, err := q.r.ReadSlice('\n')
		line = append(line, part...)
		if len(line) > qmpMaxLine {
			return nil, errors.New("QEMU sent a line longer than 8 MiB")
		}
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func (q *qmpConn) close() error { return q.c.Close() }
