package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	fspb "github.com/nookhq/nook/internal/e2b/envdpb/filesystem"
	"github.com/nookhq/nook/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/nookhq/nook/internal/errdefs"
)

// filesystemService is envd's Filesystem service over the Manager's file
// API. What it makes belongs to the request's user, as envd's does.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server

	mu       sync.Mutex
	watchers map[string]*pollWatcher // by watcher ID
}

// Limits of the polled watchers (CreateWatcher).
const (
	maxWatcherEvents = 1000             // events kept between two GetWatcherEvents
	watcherIdle      = 10 * time.Minute // a watcher not polled for this long is removed
	maxWatchers      = 16               // polled watchers a sandbox may have at once
)

// resolvePath is p as an absolute, clean path in the sandbox: envd reads
// a relative path, "~" and "~/..." in the user's home.
func resolvePath(user, p string) (string, error) {
	if user == "." || user == ".." || strings.Contains(user, "/") {
		return "", errdefs.Invalid("%q is not a user name", user)
	}
	home := homeOf(user)
	switch {
	case p == "" || p == "~":
		p = home
	case strings.HasPrefix(p, "~/"):
		p = home + p[1:]
	case strings.HasPrefix(p, "~"):
		return "", errdefs.Invalid("path %q: cannot expand another user's home directory", p)
	case !path.IsAbs(p):
		p = home + "/" + p
	}
	return path.Clean(p), nil
}

// at is the target of ctx's request and p resolved for its user.
func at(ctx context.Context, p string) (target, string, error) {
	t := targetOf(ctx)
	p, err := resolvePath(t.user, p)
	return t, p, err
}

// entryOf is envd's EntryInfo for a nook file: mode holds the permission
// bits alone and permissions Go's rendering of the whole mode, as envd
// has them. Owners are numeric (nook's FileInfo has no names) but for
// root, and metadata is empty: nook keeps no xattrs.
func entryOf(info *api.FileInfo, names *idNames) *fspb.EntryInfo {
	bits, _ := strconv.ParseUint(info.Mode, 8, 32)
	mode := api.FileModeOf(uint32(bits))
	e := &fspb.EntryInfo{
		Name: path.Base(info.Path), Path: info.Path, Size: info.Size,
		Mode: uint32(mode.Perm()), Owner: names.user(info.UID), Group: names.group(info.GID),
	}
	switch info.Type {
	case api.FileTypeFile:
		e.Type = fspb.FileType_FILE_TYPE_FILE
	case api.FileTypeDir:
		e.Type, mode = fspb.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case api.FileTypeSymlink:
		e.Type, mode = fspb.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
		target := info.LinkTarget
		if target != "" && !path.IsAbs(target) {
			target = path.Join(path.Dir(info.Path), target)
		}
		e.SymlinkTarget = &target
	default:
		mode |= fs.ModeIrregular
	}
	e.Permissions = mode.String()
	e.Metadata = info.Metadata
	if !info.ModTime.IsZero() {
		e.ModifiedTime = timestamppb.New(info.ModTime)
	}
	return e
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	t, p, err := at(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	info, err := f.s.m.StatFile(ctx, t.sb.Name, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: entryOf(info, f.s.names(ctx, t))}), nil
}

// MakeDir makes a directory and its missing parents. An existing
// directory is AlreadyExists (the SDKs' makeDir answers false), an
// existing file InvalidArgument.
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	t, p, err := at(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	info, err := f.s.m.Mkdir(ctx, t.sb.Name, t.user, api.MkdirRequest{Path: p})
	switch {
	case errors.Is(err, errdefs.ErrNotFound): // a parent is missing
		info, err = f.s.m.Mkdir(ctx, t.sb.Name, t.user, api.MkdirRequest{Path: p, Parents: true})
	case errors.Is(err, errdefs.ErrAlreadyExists):
		if st, serr := f.s.m.StatFile(ctx, t.sb.Name, p); serr == nil && st.Type != api.FileTypeDir {
			return nil, errdefs.Invalid("path already exists but it is not a directory: %s", p)
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", p))
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: entryOf(info, f.s.names(ctx, t))}), nil
}

// Move renames like rename(2), replacing a file at the destination, and
// makes the destination's missing parents as envd does.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	t, src, err := at(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, dst, err := at(ctx, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	mv := api.MoveRequest{From: src, To: dst, Overwrite: true}
	info, err := f.s.m.MoveFile(ctx, t.sb.Name, mv)
	if errors.Is(err, errdefs.ErrNotFound) {
		// The source is missing, or the destination's parent: make the
		// parent and try again.
		if _, merr := f.s.m.Mkdir(ctx, t.sb.Name, t.user, api.MkdirRequest{Path: path.Dir(dst), Parents: true}); merr == nil {
			info, err = f.s.m.MoveFile(ctx, t.sb.Name, mv)
		}
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: entryOf(info, f.s.names(ctx, t))}), nil
}

// ListDir lists a directory's entries depth levels down (0 and 1: its
// own). Deeper listings read nook's recursive listing and keep what is
// shallow enough; one that hits agent.MaxListEntries answers what it got.
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	t, p, err := at(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	l, err := f.s.m.ListFiles(ctx, t.sb.Name, p, depth > 1, agent.MaxListEntries)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if l.Root.Type != api.FileTypeDir {
		return nil, errdefs.Invalid("path is not a directory: %s", p)
	}
	res := &fspb.ListDirResponse{}
	names := f.s.names(ctx, t)
	for {
		batch, err := l.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		for i := range batch {
			if depth == 1 || depthBelow(p, batch[i].Path) <= depth {
				res.Entries = append(res.Entries, entryOf(&batch[i], names))
			}
		}
	}
	return connect.NewResponse(res), nil
}

// depthBelow is how many levels below dir p is (1: in dir).
func depthBelow(dir, p string) int {
	rel := strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
	return strings.Count(rel, "/") + 1
}

// Remove removes a file or a whole tree; a missing path is no error.
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	t, p, err := at(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := f.s.m.RemoveFile(ctx, t.sb.Name, p, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// watch starts a watch of a directory for ctx's request.
func (f *filesystemService) watch(ctx context.Context, t target, dir string, recursive bool) (*agent.FileWatch, error) {
	w, err := f.s.m.WatchFiles(ctx, t.sb.Name, dir, recursive)
	if err != nil {
		return nil, err
	}
	if w.Root.Type != api.FileTypeDir {
		w.Close()
		return nil, errdefs.Invalid("path is not a directory: %s", dir)
	}
	return w, nil
}

// eventOf is envd's event for a nook one, with the entry if asked for and
// the event leaves one at the path (create, write, chmod).
func (f *filesystemService) eventOf(ctx context.Context, t target, dir string, ev api.FileEvent, entry bool) (*fspb.FilesystemEvent, error) {
	if strings.HasPrefix(filepath.Base(ev.Path), ".nook-write-") {
		// The temporary file of a write through nook's file API, which
		// lands as a rename onto its path (a create there): not the
		// caller's file.
		return nil, nil
	}
	var typ fspb.EventType
	switch ev.Type {
	case api.FileEventCreate:
		typ = fspb.EventType_EVENT_TYPE_CREATE
	case api.FileEventWrite:
		typ = fspb.EventType_EVENT_TYPE_WRITE
	case api.FileEventRemove:
		typ = fspb.EventType_EVENT_TYPE_REMOVE
	case api.FileEventRename:
		typ = fspb.EventType_EVENT_TYPE_RENAME
	case api.FileEventChmod:
		typ = fspb.EventType_EVENT_TYPE_CHMOD
	case api.FileEventOverflow:
		// envd ends the watch with an error when inotify's queue overflows.
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("watching %s: the watch fell behind and events were lost", dir))
	default:
		return nil, nil
	}
	name, err := filepath.Rel(dir, ev.Path)
	if err != nil {
		name = ev.Path
	}
	e := &fspb.FilesystemEvent{Name: name, Type: typ}
	if entry && typ != fspb.EventType_EVENT_TYPE_REMOVE && typ != fspb.EventType_EVENT_TYPE_RENAME {
		if info, err := f.s.m.StatFile(ctx, t.sb.Name, ev.Path); err == nil {
			e.Entry = entryOf(info, f.s.names(ctx, t))
		}
	}
	return e, nil
}

// gone reports whether t's sandbox is no longer there or no longer running.
func (f *filesystemService) gone(t target) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sb, err := f.s.m.Get(ctx, t.sb.Name)
	if err != nil {
		return errors.Is(err, errdefs.ErrNotFound)
	}
	return sb.ID != t.sb.ID || sb.State != core.StateRunning
}

type watchResult struct {
	ev  api.FileEvent
	err error
}

// WatchDir streams a directory's events: start first, then an event per
// change, and a keepalive when nothing was sent for the
// Keepalive-Ping-Interval. If the sandbox goes away the response is
// aborted, not ended: the SDKs take a clean end for a watch that stopped.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	t, dir, err := at(ctx, req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := f.watch(ctx, t, dir, req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	defer w.Close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	stop := make(chan struct{})
	defer close(stop)
	next := make(chan watchResult)
	go func() {
		for {
			ev, err := w.Next()
			select {
			case next <- watchResult{ev, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	every := keepaliveEvery(req.Header())
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var msg *fspb.WatchDirResponse
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}
		case r := <-next:
			if r.err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if f.gone(t) {
					panic(http.ErrAbortHandler)
				}
				return fmt.Errorf("watching %s: %w", dir, r.err)
			}
			e, err := f.eventOf(ctx, t, dir, r.ev, req.Msg.GetIncludeEntry())
			if err != nil {
				return err
			}
			if e == nil {
				continue
			}
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: e}}
			tick.Reset(every)
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
}

// pollWatcher is a watch that keeps its events until they are fetched
// (CreateWatcher, GetWatcherEvents).
type pollWatcher struct {
	sandboxID string
	stop      func()      // ends the watch
	idle      *time.Timer // removes the watcher when nobody polls it

	mu     sync.Mutex
	events []*fspb.FilesystemEvent
	err    error // why the watch ended
}

// add keeps an event; false means too many are kept, and the watch must
// end.
func (pw *pollWatcher) add(e *fspb.FilesystemEvent) bool {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.events) >= maxWatcherEvents {
		pw.err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d events were not fetched: the watcher stopped, and events were lost", maxWatcherEvents))
		return false
	}
	pw.events = append(pw.events, e)
	return true
}

func (pw *pollWatcher) fail(err error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.err == nil {
		pw.err = err
	}
}

// take returns the events kept, or once they are all taken why the watch
// ended.
func (pw *pollWatcher) take() ([]*fspb.FilesystemEvent, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	ev := pw.events
	pw.events = nil
	if len(ev) == 0 && pw.err != nil {
		return nil, pw.err
	}
	return ev, nil
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	t, dir, err := at(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// The watch outlives the request: it ends on RemoveWatcher, when
	// nobody polls it, or with the sandbox.
	f.mu.Lock()
	n := 0
	for _, pw := range f.watchers {
		if pw.sandboxID == t.sb.ID {
			n++
		}
	}
	f.mu.Unlock()
	if n >= maxWatchers {
		return nil, errdefs.Exhausted("sandbox %s has %d watchers already: remove one first", t.sb.Name, n)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := f.watch(wctx, t, dir, req.Msg.GetRecursive())
	if err != nil {
		cancel()
		return nil, err
	}
	b := make([]byte, 10)
	rand.Read(b)
	id := "w" + hex.EncodeToString(b)
	pw := &pollWatcher{sandboxID: t.sb.ID, stop: func() { cancel(); w.Close() }}
	f.mu.Lock()
	if f.watchers == nil {
		f.watchers = map[string]*pollWatcher{}
	}
	n = 0
	for _, other := range f.watchers {
		if other.sandboxID == t.sb.ID {
			n++
		}
	}
	if n >= maxWatchers { // others were made meanwhile
		f.mu.Unlock()
		pw.stop()
		return nil, errdefs.Exhausted("sandbox %s has %d watchers already: remove one first", t.sb.Name, n)
	}
	f.watchers[id] = pw
	pw.idle = time.AfterFunc(watcherIdle, func() { f.removeWatcher(id) })
	f.mu.Unlock()
	include := req.Msg.GetIncludeEntry()
	go func() {
		for {
			ev, err := w.Next()
			if err != nil {
				switch {
				case wctx.Err() != nil: // removed
				case f.gone(t):
					f.removeWatcher(id)
				default:
					pw.fail(fmt.Errorf("watching %s: %w", dir, err))
				}
				return
			}
			e, err := f.eventOf(wctx, t, dir, ev, include)
			if err != nil {
				pw.fail(err)
			}
			if err != nil || e != nil && !pw.add(e) {
				pw.stop()
				return
			}
		}
	}()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

// watcher is the polled watcher id of ctx's sandbox.
func (f *filesystemService) watcher(ctx context.Context, id string) (*pollWatcher, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pw := f.watchers[id]
	if pw == nil || pw.sandboxID != targetOf(ctx).sb.ID {
		return nil, errdefs.NotFound("watcher with id %s not found", id)
	}
	return pw, nil
}

func (f *filesystemService) removeWatcher(id string) {
	f.mu.Lock()
	pw := f.watchers[id]
	delete(f.watchers, id)
	f.mu.Unlock()
	if pw != nil {
		pw.idle.Stop()
		pw.stop()
	}
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	pw, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	pw.idle.Reset(watcherIdle)
	events, err := pw.take()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	if _, err := f.watcher(ctx, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	f.removeWatcher(req.Msg.GetWatcherId())
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
