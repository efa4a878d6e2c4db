package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
)

// Volumes of a vm. A vm's guest mounts each of its volumes as a FUSE
// file system that nook-agent serves (volfuse.go); the agent forwards
// every operation to the daemon as a VolCall, and the daemon carries it
// out on the volume's directory (internal/volume's Remote) and answers
// with a VolResult. The calls travel on one stream the daemon opens
// (OpVolumes) and keeps open while the vm runs: the agent writes calls
// on it, the daemon writes results, each one frame (FrameStdout kind,
// payload: 4-byte big-endian length of the JSON header, the header, then
// the data of a read or a write), matched by ID, many in flight.
//
// Everything that makes this survive what vms do lives in the guest:
// the FUSE mounts and the agent's handles are in the vm's memory, so a
// pause to disk, a snapshot, a rollback or a fork keeps them, and the
// calls name paths, not host state (a daemon restarted, or a fork's
// daemon side, answers them alike). A call whose stream ends before its
// result (the vm paused, the daemon restarted) is sent again on the next
// stream; after a rollback or in a fork (VolumesRequest.Restored) the
// calls the snapshot had in flight fail with EIO instead.
const OpVolumes = "volumes"

// VolumesRequest is the body of an OpVolumes request: the vm's volumes in
// the order the daemon's VolCall.Vol indexes them. The agent mounts those
// not mounted yet, answers with an empty Reply, and then sends calls.
type VolumesRequest struct {
	Mounts []VolumeMountSpec `json:"mounts"`
	// Restored: the vm runs from a snapshot (a rollback, a fork), so the
	// calls it had in flight are the snapshot's, made before whatever
	// happened to the volume since: the guest fails them (EIO) instead
	// of sending them again. (After a pause, it sends them again.)
	Restored bool `json:"restored,omitempty"`
}

// VolumeMountSpec is where the guest mounts a volume.
type VolumeMountSpec struct {
	Name     string `json:"name"` // shown as the file system's source
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// maxVolumes bounds a VolumesRequest.
const maxVolumes = 64

func (v *VolumesRequest) validate() error {
	if len(v.Mounts) == 0 || len(v.Mounts) > maxVolumes {
		return fmt.Errorf("a volumes request names 1 to %d volumes", maxVolumes)
	}
	for _, m := range v.Mounts {
		if !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" || strings.IndexByte(m.Path, 0) >= 0 {
			return fmt.Errorf("volume path %q is not a clean absolute path below /", m.Path)
		}
		if len(m.Name) > 255 || strings.ContainsAny(m.Name, ",\x00") {
			return fmt.Errorf("volume name %q is not valid", m.Name)
		}
	}
	return nil
}

// VolCall ops.
const (
	VolOpLookup   = "lookup"   // Path: its attributes, not following a symlink
	VolOpSetattr  = "setattr"  // Path: Set says which of Mode, UID/GID, Size, Atime/Mtime
	VolOpReaddir  = "readdir"  // Path: up to Size entries after the first Off
	VolOpRead     = "read"     // Path: up to Size bytes at Off
	VolOpWrite    = "write"    // Path: the data at Off
	VolOpCreate   = "create"   // Path: a regular file of Mode owned by UID/GID (Flags: VolExcl)
	VolOpMkdir    = "mkdir"    // Path: a directory of Mode owned by UID/GID
	VolOpSymlink  = "symlink"  // Path: a symlink to Target owned by UID/GID
	VolOpLink     = "link"     // Path: a hard link to To
	VolOpReadlink = "readlink" // Path
	VolOpUnlink   = "unlink"   // Path
	VolOpRmdir    = "rmdir"    // Path
	VolOpRename   = "rename"   // Path to To (Flags: VolNoReplace)
	VolOpStatfs   = "statfs"   // the volume's file system
	VolOpFsync    = "fsync"    // Path
)

// VolCall flags and setattr fields.
const (
	VolExcl      = 1 << 0 // create: fail if it exists
	VolNoReplace = 1 << 1 // rename: fail if To exists

	VolSetMode  = 1 << 0
	VolSetUID   = 1 << 1
	VolSetGID   = 1 << 2
	VolSetSize  = 1 << 3
	VolSetAtime = 1 << 4
	VolSetMtime = 1 << 5
)

// Bounds of one call, so that neither end allocates without bound.
const (
	// VolMaxIO is the most a read or a write moves in one call (the
	// FUSE mount's max_write and max_read).
	VolMaxIO = 512 << 10
	// VolMaxEntries is the most entries one readdir answers.
	// VolMaxEntries is the most entries one readdir answers: names of
	// 255 bytes (base64 on the wire) and all, a page fits a frame.
	VolMaxEntries = 2048
	volMaxHeader  = api.MaxFramePayload - 4
)

// VolCall is one file operation the guest asks for, on a path relative
// to the volume's root ("" is the root).
type VolCall struct {
	ID     uint64 `json:"id"`
	Vol    int    `json:"vol"`
	Op     string `json:"op"`
	Path   string `json:"path,omitempty"`
	To     string `json:"to,omitempty"`     // rename, link: the other path
	Target string `json:"target,omitempty"` // symlink: its content
	Off    int64  `json:"off,omitempty"`
	Size   int    `json:"size,omitempty"`
	Mode   uint32 `json:"mode,omitempty"`
	UID    uint32 `json:"uid,omitempty"`
	GID    uint32 `json:"gid,omitempty"`
	Flags  uint32 `json:"flags,omitempty"`
	Set    uint32 `json:"set,omitempty"`
	Atime  int64  `json:"atime,omitempty"` // nanoseconds since the epoch
	Mtime  int64  `json:"mtime,omitempty"`
}

// VolResult answers a VolCall. Errno is the call's error (0: none).
type VolResult struct {
	ID      uint64     `json:"id"`
	Errno   int32      `json:"errno,omitempty"`
	Attr    *VolAttr   `json:"attr,omitempty"`
	Entries []VolEntry `json:"entries,omitempty"`
	EOF     bool       `json:"eof,omitempty"` // readdir: no entries after these
	Target  string     `json:"target,omitempty"`
	N       int        `json:"n,omitempty"` // write: bytes written
	Statfs  *VolStatfs `json:"statfs,omitempty"`
}

// VolAttr is a file's attributes.
type VolAttr struct {
	Ino    uint64 `json:"ino"`
	Mode   uint32 `json:"mode"` // type and permission bits, as st_mode
	Nlink  uint32 `json:"nlink"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Size   int64  `json:"size"`
	Blocks int64  `json:"blocks"`
	Atime  int64  `json:"atime"`
	Mtime  int64  `json:"mtime"`
	Ctime  int64  `json:"ctime"`
}

// VolEntry is a directory entry.
type VolEntry struct {
	Name string `json:"name"`
	Mode uint32 `json:"mode"` // type bits
	Ino  uint64 `json:"ino,omitempty"`
}

// VolStatfs is a volume's space.
type VolStatfs struct {
	Blocks, Bfree, Bavail, Files, Ffree uint64
	Bsize, NameLen                      uint32
}

// Names travel as bytes (base64 in the JSON): a file name is any bytes
// but / and NUL, and JSON strings would turn what is not UTF-8 into
// U+FFFD, a name that is not the file's.

type volCallPlain VolCall

type volCallWire struct {
	volCallPlain
	Path   []byte `json:"path,omitempty"`
	To     []byte `json:"to,omitempty"`
	Target []byte `json:"target,omitempty"`
}

// MarshalJSON sends the names as bytes.
func (c VolCall) MarshalJSON() ([]byte, error) {
	return json.Marshal(volCallWire{volCallPlain(c), []byte(c.Path), []byte(c.To), []byte(c.Target)})
}

// UnmarshalJSON reads the names as bytes.
func (c *VolCall) UnmarshalJSON(b []byte) error {
	var w volCallWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*c = VolCall(w.volCallPlain)
	c.Path, c.To, c.Target = string(w.Path), string(w.To), string(w.Target)
	return nil
}

type volResultPlain VolResult

type volResultWire struct {
	volResultPlain
	Target []byte `json:"target,omitempty"`
}

// MarshalJSON sends the symlink target as bytes.
func (r VolResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(volResultWire{volResultPlain(r), []byte(r.Target)})
}

// UnmarshalJSON reads the symlink target as bytes.
func (r *VolResult) UnmarshalJSON(b []byte) error {
	var w volResultWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = VolResult(w.volResultPlain)
	r.Target = string(w.Target)
	return nil
}

type volEntryPlain VolEntry

type volEntryWire struct {
	volEntryPlain
	Name []byte `json:"name"`
}

// MarshalJSON sends the name as bytes.
func (e VolEntry) MarshalJSON() ([]byte, error) {
	return json.Marshal(volEntryWire{volEntryPlain(e), []byte(e.Name)})
}

// UnmarshalJSON reads the name as bytes.
func (e *VolEntry) UnmarshalJSON(b []byte) error {
	var w volEntryWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = VolEntry(w.volEntryPlain)
	e.Name = string(w.Name)
	return nil
}

// encodeVol is one message: header length, JSON header, data.
func encodeVol(hdr any, data []byte) ([]byte, error) {
	h, err := json.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	if len(h) > volMaxHeader || 4+len(h)+len(data) > api.MaxFramePayload {
		return nil, errors.New("volume message too large")
	}
	b := make([]byte, 4, 4+len(h)+len(data))
	binary.BigEndian.PutUint32(b, uint32(len(h)))
	b = append(b, h...)
	return append(b, data...), nil
}

// splitVol parses a message into its header (decoded into hdr) and data.
func splitVol(p []byte, hdr any) ([]byte, error) {
	if len(p) < 4 {
		return nil, errors.New("volume message shorter than its header length")
	}
	n := binary.BigEndian.Uint32(p)
	if n > volMaxHeader || int(n) > len(p)-4 {
		return nil, errors.New("volume message header length out of range")
	}
	if err := json.Unmarshal(p[4:4+n], hdr); err != nil {
		return nil, fmt.Errorf("volume message header: %w", err)
	}
	return p[4+n:], nil
}

// EncodeVolCall is a call as the guest sends it.
func EncodeVolCall(c *VolCall, data []byte) ([]byte, error) { return encodeVol(c, data) }

// DecodeVolCall parses and checks a call from the guest (untrusted).
func DecodeVolCall(p []byte) (*VolCall, []byte, error) {
	var c VolCall
	data, err := splitVol(p, &c)
	if err != nil {
		return nil, nil, err
	}
	if err := c.check(len(data)); err != nil {
		return &c, nil, err // c.ID lets the caller answer
	}
	return &c, data, nil
}

func (c *VolCall) check(dataLen int) error {
	if c.Vol < 0 || c.Vol >= maxVolumes {
		return fmt.Errorf("volume index %d out of range", c.Vol)
	}
	for _, p := range []string{c.Path, c.To} {
		if !volPathOK(p) {
			return fmt.Errorf("path %q is not a clean path inside the volume", p)
		}
	}
	if len(c.Target) > 4095 || strings.IndexByte(c.Target, 0) >= 0 {
		return errors.New("symlink target not valid")
	}
	if c.Off < 0 || c.Size < 0 {
		return errors.New("negative offset or size")
	}
	switch c.Op {
	case VolOpRead:
		if c.Size > VolMaxIO {
			return fmt.Errorf("read of %d bytes exceeds %d", c.Size, VolMaxIO)
		}
	case VolOpReaddir:
		if c.Size > VolMaxEntries {
			return fmt.Errorf("readdir of %d entries exceeds %d", c.Size, VolMaxEntries)
		}
	case VolOpWrite:
		if dataLen > VolMaxIO {
			return fmt.Errorf("write of %d bytes exceeds %d", dataLen, VolMaxIO)
		}
	case VolOpRename, VolOpLink:
		if c.To == "" {
			return fmt.Errorf("%s needs a second path", c.Op)
		}
	case VolOpSymlink:
		if c.Target == "" {
			return errors.New("symlink needs a target")
		}
	case VolOpLookup, VolOpSetattr, VolOpCreate, VolOpMkdir, VolOpReadlink, VolOpUnlink, VolOpRmdir, VolOpStatfs, VolOpFsync:
	default:
		return fmt.Errorf("unknown volume op %q", c.Op)
	}
	if dataLen > 0 && c.Op != VolOpWrite {
		return fmt.Errorf("%s carries no data", c.Op)
	}
	return nil
}

// volPathOK: "" (the root) or a clean relative path of at most 4095
// bytes whose names are at most 255 (what Linux allows).
func volPathOK(p string) bool {
	if p == "" {
		return true
	}
	if len(p) > 4095 || strings.IndexByte(p, 0) >= 0 || path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../") {
		return false
	}
	for name := range strings.SplitSeq(p, "/") {
		if len(name) > 255 {
			return false
		}
	}
	return true
}

// VolumeHandler carries out a guest's volume calls on the host. Handle
// may be called from several goroutines at once; data is valid only
// during the call.
type VolumeHandler interface {
	Handle(c *VolCall, data []byte) (*VolResult, []byte)
}

// volServeWorkers bounds the calls one vm has in flight on the host.
const volServeWorkers = 8

// ServeVolumes opens the volume stream of a vm's agent (mounting what it
// has not mounted; mounted is called once the agent says they are) and
// serves its calls with h until the stream ends:
// the vm paused or stopped, the session closed, or ctx ended. The stream
// does not count as a request in flight (Streams, Quiesce): it is the
// guest's, and idles with it.
func (c *Client) ServeVolumes(ctx context.Context, req *VolumesRequest, h VolumeHandler, mounted func()) error {
	var r Reply
	st, fr, err := c.requestWait(ctx, Request{Op: OpVolumes, Volumes: req}, &r, background)
	if err != nil {
		return err
	}
	mounted()
	stop := context.AfterFunc(ctx, func() { abort(st) })
	defer stop()
	defer abort(st)
	var wmu sync.Mutex
	sem := make(chan struct{}, volServeWorkers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		kind, p, err := fr.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("volume stream: %w", err)
		}
		if kind != api.FrameStdout {
			return fmt.Errorf("volume stream: unexpected frame %d", kind)
		}
		call, data, err := DecodeVolCall(p)
		if call == nil {
			return fmt.Errorf("volume stream: %w", err) // no ID to answer: the stream is broken
		}
		var res *VolResult
		var out []byte
		if err != nil {
			res = &VolResult{Errno: int32(syscall.EINVAL)}
		} else {
			data = append([]byte(nil), data...) // the reader's buffer is reused
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if res == nil {
				res, out = h.Handle(call, data)
			}
			res.ID = call.ID
			b, err := encodeVol(res, out)
			if err != nil {
				b, _ = encodeVol(&VolResult{ID: call.ID, Errno: int32(syscall.EIO)}, nil)
			}
			wmu.Lock()
			defer wmu.Unlock()
			// A guest that reads no results must not hold a worker forever.
			st.SetWriteDeadline(time.Now().Add(c.timeout))
			if api.WriteFrame(st, api.FrameStdout, b) != nil {
				abort(st)
			}
		}()
	}
}
