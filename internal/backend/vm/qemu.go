package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/poll"
)

// machine is everything that must be identical between the QEMU that saved
// a memory snapshot and the one restoring it.
type machine struct {
	Accel     string // kvm or tcg
	CPUs      int
	MemoryMiB int64
	Kernel    *Kernel
	TSCKHz    int64  // the host's TSC frequency, for tsc_early_khz
	Init      string // api.InitSystemd: the guest boots systemd; else the agent stays PID 1
}

// launch is one QEMU process's files. QEMU opens none of them by name:
// the daemon opens each (disks read-only but the top layer, the tap, the
// console log; the QMP and agent sockets it listens on) and QEMU inherits
// the descriptors (args), so QEMU runs as a user that owns no file, in a
// network namespace of its own (see start).
type launch struct {
	machine
	MemPath   string // guest RAM file; empty: anonymous memory (or MemFile)
	MemShared bool   // share=on: guest writes go to the file (a template boot); off: private copy-on-write
	// MemFile is guest RAM QEMU maps from an inherited descriptor: a
	// template snapshot's sealed memfd (copy-on-write, see templateRAM),
	// or a template boot's RAM (MemShared).
	MemFile    *os.File
	Disk       string // qcow2 root disk
	AgentSock  string // virtio-serial chardev socket (QEMU listens)
	QMPSock    string
	ConsoleLog string
	Incoming   bool // wait for a migration stream (restore) instead of booting
	// Chain is the top disk's backing chain, nearest first.
	Chain []layerRef
	// Tap is the host's tap device for the guest's NIC; empty: the NIC is
	// on an empty hub (no network). Every vm has the NIC, so that a
	// snapshot's devices match whatever network a restore gives it.
	Tap string
	// ExtraCmdline is appended to the kernel command line.
	ExtraCmdline string
}

// cmdline is the guest kernel command line.
func (m machine) cmdline() string {
	args := []string{"console=ttyS0", "quiet", "loglevel=3", "panic=-1", "reboot=t", "random.trust_cpu=on",
		"nomodeset", "pci=off", "i8042.noaux", "i8042.nomux", "i8042.dumbkbd", "audit=0", "mitigations=off", "rdinit=/nook-agent"}
	if m.TSCKHz > 0 {
		args = append(args, fmt.Sprintf("tsc_early_khz=%d", m.TSCKHz))
	}
	if m.Init == api.InitSystemd {
		args = append(args, guestinit.SystemdArg)
	}
	return strings.Join(args, " ")
}

// fdTable is the descriptors a QEMU inherits (exec.Cmd.ExtraFiles): the
// child sees files[i] as descriptor 3+i.
type fdTable struct {
	files []*os.File
	owned []*os.File // opened for this QEMU: closed once it started
	sets  int
}

// add passes f to QEMU and returns its descriptor number there.
func (t *fdTable) add(f *os.File) int {
	t.files = append(t.files, f)
	return 2 + len(t.files)
}

// open opens path for QEMU and passes it.
func (t *fdTable) open(path string, flag int) (int, error) {
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return 0, err
	}
	t.owned = append(t.owned, f)
	return t.add(f), nil
}

// fdset opens path for QEMU as an -add-fd set and returns the set's
// name (/dev/fdset/N), which QEMU's block and file layers open.
func (t *fdTable) fdset(a *[]string, path string, flag int, opaque bool) (string, error) {
	fd, err := t.open(path, flag)
	if err != nil {
		return "", err
	}
	t.sets++
	spec := fmt.Sprintf("fd=%d,set=%d", fd, t.sets)
	if opaque {
		spec += ",opaque=" + path // names the vm in QEMU's command line (qemuPID)
	}
	*a = append(*a, "-add-fd", spec)
	return fmt.Sprintf("/dev/fdset/%d", t.sets), nil
}

// listen makes a listening unix socket at path (root's, in the vm's
// directory) for QEMU to accept on.
func (t *fdTable) listen(path string) (int, error) {
	os.Remove(path)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		f.Close()
		return 0, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		f.Close()
		return 0, fmt.Errorf("listen on %s: %w", path, err)
	}
	t.owned = append(t.owned, f)
	return t.add(f), nil
}

// close closes the daemon's copies of what it opened for QEMU.
func (t *fdTable) close() {
	for _, f := range t.owned {
		f.Close()
	}
	t.owned = nil
}

// args is the QEMU command line: a microvm with no default devices, the
// root disk, the agent's virtio-serial port, a serial console into a log
// file, QMP, and QEMU's own seccomp sandbox. It opens what QEMU needs
// into fds; the caller closes them once QEMU started.
func (l launch) args(fds *fdTable) ([]string, error) {
	share := "off"
	if l.MemShared {
		share = "on"
	}
	accel := "tcg,tb-size=64"
	// Under TCG a CPU model without AVX is faster: glibc then picks SSE
	// string functions, which TCG emulates far more cheaply (measured:
	// fork+exec of /bin/true in the guest 30 ms with qemu64, 50 ms with max).
	cpu := "qemu64"
	if l.Accel == "kvm" {
		accel, cpu = "kvm", "host"
	}
	memBackend := fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", l.MemoryMiB, l.MemPath, share)
	switch {
	case l.MemFile != nil:
		// QEMU 7.2 opens a memory-backend-file read-write (its readonly=on
		// makes the guest's RAM a ROM), so the template's RAM comes as a
		// memfd sealed against writes: QEMU reopens it, maps it private
		// (copy-on-write), and can never change what other vms map.
		memBackend = fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=/proc/self/fd/%d,share=%s", l.MemoryMiB, fds.add(l.MemFile), share)
	case l.MemPath == "":
		memBackend = fmt.Sprintf("memory-backend-ram,id=mem,size=%dM", l.MemoryMiB)
	}
	// The kernel's files are world-readable (ensureKernel): QEMU reopens
	// them through its descriptors.
	kernel, err := fds.open(l.Kernel.Vmlinux, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	initrd, err := fds.open(l.Kernel.Initrd, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	a := []string{
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-M", "microvm,pit=on,pic=on,rtc=on,isa-serial=on,memory-backend=mem",
		"-accel", accel, "-cpu", cpu,
		"-smp", strconv.Itoa(l.CPUs), "-m", fmt.Sprintf("%dM", l.MemoryMiB),
		"-object", memBackend,
		"-kernel", fmt.Sprintf("/proc/self/fd/%d", kernel), "-initrd", fmt.Sprintf("/proc/self/fd/%d", initrd),
		"-append", strings.TrimSpace(l.cmdline() + " " + l.ExtraCmdline),
	}
	if l.Disk != "" {
		// The backing chain comes from nook's records, each layer opened
		// read-only with its backing named explicitly: QEMU never follows a
		// backing file name from a qcow2 header, which the guest's QEMU
		// could have rewritten in the top layer. Layers are immutable, so
		// they are opened without image locks. (A vm a snapshot was taken
		// of still holds its old top open for writing, as the backing of
		// its new top: QEMU cannot reopen a descriptor it was given. The
		// snapshot's layer is a copy of it, no QEMU's: see Snapshot.)
		below := ""
		for i := len(l.Chain) - 1; i >= 0; i-- {
			layer := l.Chain[i]
			node := fmt.Sprintf("layer%d", i)
			name, err := fds.fdset(&a, layer.Path, os.O_RDONLY, false)
			if err != nil {
				return nil, err
			}
			spec := fmt.Sprintf("driver=%s,node-name=%s,read-only=on,file.driver=file,file.filename=%s,file.locking=off", layer.Format, node, name)
			if layer.Format == "qcow2" {
				if below == "" {
					spec += ",backing=null"
				} else {
					spec += ",backing=" + below
				}
			}
			a = append(a, "-blockdev", spec)
			below = node
		}
		name, err := fds.fdset(&a, l.Disk, os.O_RDWR, true)
		if err != nil {
			return nil, err
		}
		top := fmt.Sprintf("driver=qcow2,node-name=root,file.driver=file,file.filename=%s,file.aio=threads,cache.direct=off", name)
		if below != "" {
			top += ",backing=" + below
		}
		mods, err := fds.fdset(&a, l.Kernel.Modules, os.O_RDONLY, false)
		if err != nil {
			return nil, err
		}
		a = append(a,
			"-blockdev", top,
			"-device", "virtio-blk-device,drive=root",
			"-blockdev", fmt.Sprintf("driver=raw,node-name=modules,read-only=on,file.driver=file,file.filename=%s", mods),
			"-device", "virtio-blk-device,drive=modules")
	}
	if l.AgentSock != "" {
		fd, err := fds.listen(l.AgentSock)
		if err != nil {
			return nil, err
		}
		a = append(a,
			"-device", "virtio-serial-device,max_ports=2",
			"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", fd),
			"-device", "virtserialport,chardev=agent,name=nook.agent",
			"-device", "virtio-rng-device")
	}
	if l.Disk != "" {
		netdev := "hubport,id=net0,hubid=0"
		if l.Tap != "" {
			tap, err := openTap(l.Tap)
			if err != nil {
				return nil, err
			}
			fds.owned = append(fds.owned, tap)
			netdev = fmt.Sprintf("tap,id=net0,fd=%d", fds.add(tap))
		}
		a = append(a, "-netdev", netdev, "-device", "virtio-net-device,netdev=net0,mac=52:54:00:6e:6f:6b")
	}
	if l.ConsoleLog != "" {
		name, err := fds.fdset(&a, l.ConsoleLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, false)
		if err != nil {
			return nil, err
		}
		a = append(a, "-chardev", fmt.Sprintf("file,id=console,path=%s,append=on", name), "-serial", "chardev:console")
	} else {
		a = append(a, "-serial", "stdio")
	}
	if l.QMPSock != "" {
		fd, err := fds.listen(l.QMPSock)
		if err != nil {
			return nil, err
		}
		a = append(a, "-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", fd), "-mon", "chardev=qmp,mode=control")
	}
	// QEMU starts as its own unprivileged user (start): it never gains or
	// changes privileges.
	a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	if l.Incoming {
		a = append(a, "-incoming", "defer")
	}
	return a, nil
}

// openTap attaches to the host's tap device name (in the calling thread's
// network namespace, where the network manager made it) the way QEMU's
// -netdev tap,ifname= would: no packet info, virtio-net headers, one
// queue. QEMU gets the descriptor: it needs neither the host's network
// namespace nor the right to open taps.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("attach to tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

// monitor is a QMP connection to one QEMU.
type monitor struct {
	q *qmpConn
}

// dialQMP connects to a QEMU's QMP socket, waiting for QEMU to create it.
func dialQMP(ctx context.Context, path string) (*monitor, error) {
	var q *qmpConn
	var last error
	if err := poll.Until(ctx, poll.Options{Min: 2 * time.Millisecond, Max: 2 * time.Millisecond}, func() (bool, error) {
		q, last = qmpDial(ctx, path)
		return last == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("connect to QEMU's monitor: %w (last error: %v)", err, last)
	}
	return &monitor{q: q}, nil
}

// run executes a QMP command and decodes its "return" into out (if not nil).
func (m *monitor) run(cmd string, args any, out any) error {
	return m.runFile(cmd, args, nil, out)
}

func (m *monitor) runFile(cmd string, args any, f *os.File, out any) error {
	b, err := json.Marshal(struct {
		Execute string `json:"execute"`
		Args    any    `json:"arguments,omitempty"`
	}{cmd, args})
	if err != nil {
		return err
	}
	ret, err := m.q.command(b, f, time.Now().Add(qmpTimeout))
	if err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(ret, out); err != nil {
		return fmt.Errorf("qmp %s: unexpected answer %.200q: %w", cmd, ret, err)
	}
	return nil
}

// waitMigration polls query-migrate until the migration (outgoing, or
// incoming on a restoring QEMU) completes or fails.
func (m *monitor) waitMigration(ctx context.Context) error {
	return poll.Until(ctx, poll.Options{Min: time.Millisecond, Max: time.Millisecond}, func() (bool, error) {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := m.run("query-migrate", nil, &st); err != nil {
			return false, err
		}
		switch st.Status {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			return false, fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		return false, nil
	})
}

// status returns QEMU's run state (running, paused, inmigrate, postmigrate...).
func (m *monitor) status() (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := m.run("query-status", nil, &st)
	return st.Status, err
}

func (m *monitor) close() error {
	if m == nil || m.q == nil {
		return nil
	}
	return m.q.close()
}

// setIgnoreShared turns on x-ignore-shared: guest RAM that lives in a file
// is not copied into the migration stream (the file is the snapshot).
func (m *monitor) setIgnoreShared() error {
	return m.run("migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}},
	}, nil)
}

// saveState stops the guest and writes its device state (and RAM not in a
// shared file) to f.
func (m *monitor) saveState(ctx context.Context, f *os.File) error {
	if err := m.run("stop", nil, nil); err != nil {
		return err
	}
	if err := m.runFile("getfd", map[string]any{"fdname": "snap"}, f, nil); err != nil {
		return err
	}
	// QEMU's defaults are for a live migration over a network: at most
	// 128 MiB/s, and copy rounds until the rest fits in 300 ms of
	// downtime. The guest is stopped and the stream goes to a file: as
	// fast as QEMU can write, in one pass.
	if err := m.run("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40, "downtime-limit": 60000}, nil); err != nil {
		return err
	}
	if err := m.run("migrate", map[string]any{"uri": "fd:snap"}, nil); err != nil {
		return err
	}
	return m.waitMigration(ctx)
}

// loadState feeds a saved state to a QEMU started with -incoming defer and
// lets the guest run.
func (m *monitor) loadState(ctx context.Context, f *os.File) error {
	if err := m.runFile("getfd", map[string]any{"fdname": "snap"}, f, nil); err != nil {
		return err
	}
	if err := m.run("migrate-incoming", map[string]any{"uri": "fd:snap"}, nil); err != nil {
		return err
	}
	if err := poll.Until(ctx, poll.Options{Min: 500 * time.Microsecond, Max: 500 * time.Microsecond}, func() (bool, error) {
		st, err := m.status()
		return err == nil && st != "inmigrate", err
	}); err != nil {
		return err
	}
	if err := m.waitMigration(ctx); err != nil {
		return err
	}
	return m.run("cont", nil, nil)
}

// switchTop is QEMU's copy-on-write switch: the guest's disk gets a new,
// empty top layer (the qcow2 file f, whose backing is the current top),
// and the current top becomes a read-only backing. The file goes to QEMU
// as an open descriptor: QEMU runs unprivileged and could not open it.
func (m *monitor) switchTop(f *os.File, node string) error {
	var blocks []struct {
		Inserted *struct {
			NodeName string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := m.run("query-block", nil, &blocks); err != nil {
		return err
	}
	top := ""
	for _, b := range blocks {
		if b.Inserted != nil && b.Inserted.NodeName != "modules" {
			if top != "" {
				return fmt.Errorf("QEMU has more than one disk besides the modules (%s, %s)", top, b.Inserted.NodeName)
			}
			top = b.Inserted.NodeName
		}
	}
	if top == "" {
		return errors.New("QEMU has no root disk")
	}
	var fd struct {
		FdsetID int `json:"fdset-id"`
		FD      int `json:"fd"`
	}
	if err := m.runFile("add-fd", map[string]any{}, f, &fd); err != nil {
		return err
	}
	// QEMU keeps its own duplicate of the descriptor.
	defer m.run("remove-fd", map[string]any{"fdset-id": fd.FdsetID, "fd": fd.FD}, nil)
	if err := m.run("blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": node, "backing": nil, "cache": map[string]any{"direct": false},
		"file": map[string]any{"driver": "file", "filename": fmt.Sprintf("/dev/fdset/%d", fd.FdsetID), "aio": "threads"},
	}, nil); err != nil {
		return err
	}
	if err := m.run("blockdev-snapshot", map[string]any{"node": top, "overlay": node}, nil); err != nil {
		m.run("blockdev-del", map[string]any{"node-name": node}, nil)
		return err
	}
	return nil
}

// errQEMUExited is returned when QEMU is gone while we wait for it.
var errQEMUExited = errors.New("QEMU exited")

// layerRef is one image of a disk's backing chain.
type layerRef struct {
	Path   string `json:"path"`
	Format string `json:"format"` // qcow2 or raw
}
