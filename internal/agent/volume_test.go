package agent

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
)

// slowHandler answers every call after a while, counting how many it
// carries out at once.
type slowHandler struct {
	now, most atomic.Int64
	calls     atomic.Int64
}

func (h *slowHandler) Handle(c *VolCall, data []byte) (*VolResult, []byte) {
	n := h.now.Add(1)
	defer h.now.Add(-1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			break
		}
	}
	h.calls.Add(1)
	if len(data) > 0 {
		time.Sleep(time.Millisecond)
	}
	return &VolResult{N: len(data)}, nil
}

// A guest that floods its volume stream with calls, reads no results,
// and sends what is not a call: the daemon carries out at most
// volServeWorkers calls at once, gives up on a guest that takes no
// results, and ends the stream at the first message it cannot read,
// with its memory bounded throughout.
func TestEscapeAgentVolumeFlood(t *testing.T) {
	for _, flood := range []string{"no-reader", "garbage", "bad-calls"} {
		t.Run(flood, func(t *testing.T) {
			var sent atomic.Int64
			_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
				serveStreams(conn, func(st net.Conn, req *Request) {
					if req.Op != OpVolumes {
						return
					}
					writeJSONFrame(st, Reply{})
					// Big calls where the daemon must read them all, small
					// ones where it must stop writing results nobody reads.
					call, _ := EncodeVolCall(&VolCall{Op: VolOpWrite, Path: "f"}, make([]byte, VolMaxIO))
					if flood == "no-reader" {
						call, _ = EncodeVolCall(&VolCall{Op: VolOpLookup, Path: "f"}, nil)
					}
					n := 1 << 20
					if flood == "bad-calls" {
						n = 5000
					}
					for i := 0; i < n; i++ {
						var p []byte
						switch {
						case flood == "garbage" && i == 100:
							p = []byte("\xff\xff\xff\xffnot a call")
						case flood == "bad-calls":
							p, _ = EncodeVolCall(&VolCall{Op: VolOpRead, Path: "../../etc/shadow", Size: 1 << 30}, nil)
						default:
							p = call
						}
						st.SetWriteDeadline(time.Now().Add(50 * time.Second))
						if api.WriteFrame(st, api.FrameStdout, p) != nil {
							return
						}
						sent.Add(1)
					}
				})
			})
			c.SetAnswerTimeout(2 * time.Second)
			h := &slowHandler{}
			var err error
			start := time.Now()
			growth, _ := heapGrowth(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				err = c.ServeVolumes(ctx, &VolumesRequest{Mounts: []VolumeMountSpec{{Name: "v", Path: "/v"}}}, h, func() {})
			})
			// The guest's writes wait 50 s for the daemon: the daemon must
			// end the stream before.
			if err == nil || ctxExpired(err) || time.Since(start) > 40*time.Second {
				t.Fatalf("the stream did not end on its own: %v after %v", err, time.Since(start))
			}
			if h.most.Load() > volServeWorkers {
				t.Errorf("%d calls at once, want at most %d", h.most.Load(), volServeWorkers)
			}
			if flood == "bad-calls" && h.calls.Load() > 0 {
				t.Errorf("%d calls out of the volume were carried out", h.calls.Load())
			}
			if growth > heapBound {
				t.Errorf("heap grew %d MiB", growth/mib)
			}
			t.Logf("%s: %d calls sent, %d carried out, ended with %v", flood, sent.Load(), h.calls.Load(), err)
		})
	}
}

func ctxExpired(err error) bool { return err == context.DeadlineExceeded }

// The guest's link: a call made with no stream waits for one; a call
// whose stream ends is sent again on the next, and says so.
func TestVolLinkRetries(t *testing.T) {
	l := NewVolLink()
	type answer struct {
		res     *VolResult
		retried bool
		err     error
	}
	got := make(chan answer, 1)
	go func() {
		res, _, retried, err := l.Call(context.Background(), &VolCall{Op: VolOpLookup}, nil)
		got <- answer{res, retried, err}
	}()
	// First stream: the call arrives, and the stream ends unanswered.
	host1, guest1 := net.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); l.serve(guest1, api.NewFrameReader(guest1), &frameWriter{w: guest1}, false) }()
	fr := api.NewFrameReader(host1)
	if _, p, err := fr.Next(); err != nil {
		t.Fatal(err)
	} else if c, _, err := DecodeVolCall(p); err != nil || c.Op != VolOpLookup {
		t.Fatalf("call %+v %v", c, err)
	}
	host1.Close()
	wg.Wait()
	// Second stream: it is sent again and answered.
	host2, guest2 := net.Pipe()
	go l.serve(guest2, api.NewFrameReader(guest2), &frameWriter{w: guest2}, false)
	fr = api.NewFrameReader(host2)
	_, p, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := DecodeVolCall(p)
	b, _ := encodeVol(&VolResult{ID: c.ID, Errno: int32(syscall.ENOENT)}, nil)
	if err := api.WriteFrame(host2, api.FrameStdout, b); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		if a.err != nil || !a.retried || syscall.Errno(a.res.Errno) != syscall.ENOENT {
			t.Fatalf("answer %+v", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not answered")
	}
	host2.Close()
}

func FuzzDecodeVolCall(f *testing.F) {
	for _, c := range []VolCall{{Op: VolOpRead, Path: "a/b", Size: 10}, {Op: VolOpRename, Path: "a", To: "b"}, {Op: VolOpSymlink, Path: "l", Target: "/x"}} {
		b, _ := EncodeVolCall(&c, nil)
		f.Add(b)
	}
	f.Add([]byte("\x00\x00\x00\x02{}data"))
	f.Fuzz(func(t *testing.T, p []byte) {
		c, data, err := DecodeVolCall(p)
		if err != nil {
			return
		}
		if !volPathOK(c.Path) || !volPathOK(c.To) || len(data) > VolMaxIO || c.Size > VolMaxIO || c.Off < 0 {
			t.Fatalf("accepted %+v with %d bytes", c, len(data))
		}
		if len(c.Path) > 0 && (c.Path[0] == '/' || c.Path == ".." || len(c.Path) >= 3 && c.Path[:3] == "../") {
			t.Fatalf("accepted path %q", c.Path)
		}
	})
}

// The volume stream is the guest's, not a request in flight: it keeps
// no vm from idling (Streams) and no snapshot from quiescing.
func TestVolumeStreamIsBackground(t *testing.T) {
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			if req.Op == OpVolumes {
				writeJSONFrame(st, Reply{})
				api.NewFrameReader(st).Next() // holds the stream until it ends
			}
		})
	})
	mounted := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.ServeVolumes(context.Background(), &VolumesRequest{Mounts: []VolumeMountSpec{{Name: "v", Path: "/v"}}}, &slowHandler{}, func() { close(mounted) })
	}()
	select {
	case <-mounted:
	case <-time.After(10 * time.Second):
		t.Fatal("no volume stream")
	}
	if n := c.Streams(); n != 0 {
		t.Errorf("Streams() = %d with only the volume stream open", n)
	}
	release, ok := c.Quiesce()
	if !ok {
		t.Fatal("Quiesce refused while only the volume stream was open")
	}
	release()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the volume stream ended without an error when the session closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Quiesce did not end the volume stream")
	}
}

// A dial that hangs (a vm whose agent does not answer, which the volume
// loop keeps dialing) holds back no other caller beyond its own ctx.
func TestClientDialHoldsNobody(t *testing.T) {
	dialing := make(chan struct{}, 1)
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		select {
		case dialing <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.ServeVolumes(ctx, &VolumesRequest{Mounts: []VolumeMountSpec{{Name: "v", Path: "/v"}}}, &slowHandler{}, func() {})
	select {
	case <-dialing:
	case <-time.After(10 * time.Second):
		t.Fatal("no dial")
	}
	done := make(chan struct{})
	go func() {
		c.Streams()
		release, _ := c.Quiesce()
		release()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Streams or Quiesce waited for a dial")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer pcancel()
	start := time.Now()
	if _, err := c.Ping(pctx); err == nil {
		t.Fatal("a ping through a dial that never ends answered")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("a ping with a 300 ms deadline took %v behind another's dial", took)
	}
}

// After a restore from a snapshot (a rollback, a fork), the calls that
// were in flight fail instead of being sent again; new calls go through.
func TestVolLinkRestoredFailsStaleCalls(t *testing.T) {
	l := NewVolLink()
	got := make(chan error, 1)
	go func() {
		_, _, _, err := l.Call(context.Background(), &VolCall{Op: VolOpUnlink, Path: "f"}, nil)
		got <- err
	}()
	host1, guest1 := net.Pipe()
	go l.serve(guest1, api.NewFrameReader(guest1), &frameWriter{w: guest1}, false)
	if _, _, err := api.NewFrameReader(host1).Next(); err != nil { // the call, never answered
		t.Fatal(err)
	}
	host2, guest2 := net.Pipe()
	defer host2.Close()
	go l.serve(guest2, api.NewFrameReader(guest2), &frameWriter{w: guest2}, true)
	select {
	case err := <-got:
		if err != ErrVolumeCallStale {
			t.Fatalf("the call in flight at the snapshot: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stale call was not failed")
	}
	host1.Close()
	// A new call goes through on the restored stream.
	go func() {
		_, _, _, err := l.Call(context.Background(), &VolCall{Op: VolOpLookup}, nil)
		got <- err
	}()
	fr := api.NewFrameReader(host2)
	_, p, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := DecodeVolCall(p)
	b, _ := encodeVol(&VolResult{ID: c.ID}, nil)
	api.WriteFrame(host2, api.FrameStdout, b)
	if err := <-got; err != nil {
		t.Fatalf("a call after the restore: %v", err)
	}
}
