package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/poll"
	"golang.org/x/sys/unix"
)

// A template's root image (sparse) holds its files and this much free
// space: the most a sandbox that asks for no disk can write before its
// disk is full.
const defaultImageSize = 8 << 30

// deviceLayout changes whenever the vm's devices do (QEMU's args): a
// snapshot restores only into the same devices.
const deviceLayout = 3 // 3: the template boot's RAM is a memfd the daemon writes out

// snapshot is a template's saved running guest: sandboxes start from it.
type snapshot struct {
	dir   string
	mem   string // guest RAM; mapped copy-on-write by every sandbox
	state string // device state (x-ignore-shared: no RAM in it)
	child string // an empty qcow2 over the snapshot's disk, copied per sandbox
	chain []layerRef
}

func (b *Backend) templateDir(templateID string) string {
	return filepath.Join(b.cfg.CacheDir, "templates", templateID)
}

func (b *Backend) lockFor(key string) *sync.Mutex {
	b.smu.Lock()
	defer b.smu.Unlock()
	l := b.slock[key]
	if l == nil {
		l = &sync.Mutex{}
		b.slock[key] = l
	}
	return l
}

// ensureImage makes the template's read-only ext4 root image from its rootfs.
func (b *Backend) ensureImage(ctx context.Context, templateID string) (string, error) {
	dir := b.templateDir(templateID)
	img := filepath.Join(dir, "rootfs.ext4")
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	l := b.lockFor(img)
	l.Lock()
	defer l.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	unlock, err := fsutil.Flock(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	if err := os.WriteFile(filepath.Join(dir, "store"), []byte(b.cfg.TemplateStore), 0o600); err != nil {
		return "", err
	}
	rootfs, err := b.cfg.TemplateRootfs(templateID)
	if err != nil {
		return "", err
	}
	tmp := img + ".tmp"
	os.Remove(tmp)
	defer os.Remove(tmp)
	start := time.Now()
	size, inodes, err := imageSize(rootfs)
	if err != nil {
		return "", fmt.Errorf("measure the template's files: %w", err)
	}
	// Inode tables are written now (no lazy init), so that no guest spends
	// its first minutes zeroing them into its own copy-on-write layer.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-N", strconv.FormatInt(inodes, 10), "-L", guestinit.RootLabel,
		"-E", "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0", "-d", rootfs, tmp, strconv.FormatInt(size>>20, 10)+"M").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mkfs.ext4 -d %s: %w: %s", rootfs, err, bytes.TrimSpace(out))
	}
	if err := os.Chmod(tmp, 0o400); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", err
	}
	b.cfg.Log.Info("vm root image built", "template", templateID, "duration", time.Since(start))
	return img, nil
}

// imageSize is the size of a template's root image: room for its files
// (their blocks, counting hard links once, with their inodes, block maps
// and the journal) plus defaultImageSize free; and the inodes it needs:
// one per entry and one per 64 KiB of the free space.
func imageSize(rootfs string) (size, inodes int64, err error) {
	var blocks, entries int64
	seen := map[uint64]bool{}
	err = filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		entries++
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if !d.IsDir() && st.Nlink > 1 && st.Size > 0 { // an empty file's links take no blocks to count once
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		blocks += (st.Size + 4095) &^ 4095
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	files := (blocks + blocks/32 + entries*256 + 256<<20 + 1<<20 - 1) &^ (1<<20 - 1)
	return files + defaultImageSize, entries + defaultImageSize>>16, nil
}

// ensureSnapshot returns the template's snapshot for a machine shape,
// booting the template once and saving it if there is none yet.
func (b *Backend) ensureSnapshot(ctx context.Context, templateID string, m machine) (*snapshot, error) {
	parts := []string{strconv.Itoa(deviceLayout), m.Kernel.Hash, m.Accel, strconv.Itoa(m.CPUs), strconv.FormatInt(m.MemoryMiB, 10), b.qemuVersion()}
	if m.Init == api.InitSystemd {
		parts = append(parts, m.Init)
	}
	key := hashStrings(parts...)
	dir := filepath.Join(b.templateDir(templateID), "snap-"+key)
	s := &snapshot{dir: dir, mem: filepath.Join(dir, "mem"), state: filepath.Join(dir, "state"), child: filepath.Join(dir, "child.qcow2")}
	base := filepath.Join(b.templateDir(templateID), "rootfs.ext4")
	s.chain = []layerRef{{Path: filepath.Join(dir, "disk.qcow2"), Format: "qcow2"}, {Path: base, Format: "raw"}}
	done := filepath.Join(dir, "ok")
	if _, err := os.Stat(done); err == nil {
		return s, nil
	}
	l := b.lockFor(dir)
	l.Lock()
	defer l.Unlock()
	base, err := b.ensureImage(ctx, templateID)
	if err != nil {
		return nil, err
	}
	unlock, err := fsutil.Flock(ctx, filepath.Join(b.templateDir(templateID), "lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil {
		return s, nil
	}
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := b.bootAndSave(ctx, templateID, m, base, s); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := b.qemuImgCreate(ctx, filepath.Join(dir, "disk.qcow2"), "qcow2", s.child); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for _, f := range []string{s.mem, s.state, filepath.Join(dir, "disk.qcow2"), s.child} {
		os.Chmod(f, 0o400)
	}
	if err := os.WriteFile(done, nil, 0o400); err != nil {
		return nil, err
	}
	b.cfg.Log.Info("vm template snapshot saved", "template", templateID, "shape", key, "duration", time.Since(start))
	return s, nil
}

// bootAndSave cold-boots the template with its RAM in a shared file, waits
// for the agent, disconnects it (the guest agent goes back to waiting for
// a host) and saves the device state.
func (b *Backend) bootAndSave(ctx context.Context, templateID string, m machine, base string, s *snapshot) error {
	id := "tpl-" + filepath.Base(s.dir)
	disk := filepath.Join(s.dir, "disk.qcow2")
	if err := b.qemuImgCreate(ctx, base, "raw", disk); err != nil {
		return err
	}
	// The guest's RAM is a memfd QEMU shares (its user owns no file);
	// once QEMU has quit, the daemon writes it to the snapshot's file,
	// which no QEMU ever opens (vms get a sealed copy: templateRAM).
	ram, err := newRAM(m.MemoryMiB << 20)
	if err != nil {
		return err
	}
	defer ram.Close()
	l := launch{machine: m, MemFile: ram, MemShared: true, Disk: disk, Chain: []layerRef{{Path: base, Format: "raw"}},
		AgentSock: filepath.Join(s.dir, "agent.sock"), QMPSock: filepath.Join(s.dir, "qmp.sock"),
		ConsoleLog: filepath.Join(s.dir, "console.log")}
	sb := &core.Sandbox{ID: id, CPUs: float64(m.CPUs), MemoryBytes: m.MemoryMiB << 20}
	uid, release, err := b.reserveUID()
	if err != nil {
		return err
	}
	defer release()
	proc, err := b.start(ctx, sb, l, uid)
	if err != nil {
		return err
	}
	defer func() {
		syscall.Kill(proc.pid, syscall.SIGKILL)
		<-proc.exited
		b.Destroy(context.WithoutCancel(ctx), id) // its cgroups; the directory does not exist
		os.Remove(l.AgentSock)
		os.Remove(l.QMPSock)
	}()
	mon, err := proc.monitor(ctx)
	if err != nil {
		return err
	}
	defer mon.close()
	if err := b.waitBoot(ctx, proc, l.AgentSock, s.dir); err != nil {
		return fmt.Errorf("template boot: %w", err)
	}
	// A systemd guest is saved once it has started everything it starts
	// at boot: sandboxes restored from it have their services running.
	if m.Init == api.InitSystemd {
		if err := b.waitSystemd(ctx, l.AgentSock); err != nil {
			return fmt.Errorf("template boot: %w%s", err, b.consoleTail(s.dir))
		}
	}
	if _, failed := b.unprepared.Load(templateID); b.cfg.PrepareTemplate != nil && !failed {
		c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return dialAgent(ctx, l.AgentSock) })
		err := b.cfg.PrepareTemplate(ctx, templateID, c)
		c.Close()
		if err != nil {
			// The next boot of this build saves its snapshot without it
			// (the daemon then starts the service in each vm): a service
			// the template boot cannot make ready (it needs the network,
			// or the sandbox's env) does not cost every create its wait.
			b.unprepared.Store(templateID, true)
			return fmt.Errorf("template boot: %w", err)
		}
	}
	// Let the guest agent see the host go away and wait for the next one.
	time.Sleep(50 * time.Millisecond)
	f, err := os.Create(s.state)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := mon.setIgnoreShared(); err != nil {
		return err
	}
	if err := mon.saveState(ctx, f); err != nil {
		return fmt.Errorf("save template snapshot: %w", err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	// Flush the disk image: the snapshot's disk must hold what the guest wrote.
	if err := mon.run("quit", nil, nil); err != nil && !errors.Is(err, os.ErrClosed) {
		b.cfg.Log.Debug("qmp quit", "err", err)
	}
	select {
	case <-proc.exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("template QEMU did not quit")
	}
	return writeRAM(ram, s.mem)
}

// waitBoot waits until a booting guest's agent answers, for at most
// BootTimeout; errors carry QEMU's and the guest console's last words.
func (b *Backend) waitBoot(ctx context.Context, proc *qemuProc, sock, dir string) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.BootTimeout)
	defer cancel()
	var last error
	errExited := errors.New("QEMU exited")
	err := poll.Until(ctx, poll.Options{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond}, func() (bool, error) {
		select {
		case <-proc.exited:
			return false, errExited
		default:
		}
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		last = pingAgent(actx, sock)
		acancel()
		return last == nil, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errExited):
		return fmt.Errorf("QEMU exited: %s%s", lastLines(readTail(proc.log), 3), b.consoleTail(dir))
	}
	return fmt.Errorf("the guest agent did not answer within %s: %w%s", b.cfg.BootTimeout, last, b.consoleTail(dir))
}

var qemuVersionOnce sync.Once
var qemuVersion string

func (b *Backend) qemuVersion() string {
	qemuVersionOnce.Do(func() {
		out, _ := exec.Command(b.cfg.QEMU, "--version").Output()
		qemuVersion = string(bytes.SplitN(out, []byte("\n"), 2)[0])
	})
	return qemuVersion
}

// CachedTemplates implements core.TemplateCache: the builds of
// Config.TemplateStore this cache holds a root image or snapshots of.
func (b *Backend) CachedTemplates() []string {
	if b.cfg.TemplateStore == "" {
		return nil
	}
	var ids []string
	names, _ := os.ReadDir(filepath.Join(b.cfg.CacheDir, "templates"))
	for _, n := range names {
		builds, _ := os.ReadDir(filepath.Join(b.cfg.CacheDir, "templates", n.Name()))
		for _, bd := range builds {
			store, err := os.ReadFile(filepath.Join(b.cfg.CacheDir, "templates", n.Name(), bd.Name(), "store"))
			if bd.IsDir() && err == nil && string(store) == b.cfg.TemplateStore {
				ids = append(ids, n.Name()+"/"+bd.Name())
			}
		}
	}
	return ids
}

// ForgetTemplate implements core.TemplateCache: it destroys the build's
// warm vms and removes its root image and snapshots (of every machine
// shape), under the lock that makes them.
func (b *Backend) ForgetTemplate(ctx context.Context, templateID string) error {
	name, build, ok := strings.Cut(templateID, "/")
	if !ok || name == "" || build == "" || strings.ContainsAny(build, "/") || name == "." || name == ".." || build == "." || build == ".." {
		return fmt.Errorf("template build id %q is not valid", templateID)
	}
	if err := b.pool.Drain(ctx, templateID+"@"); err != nil {
		return err
	}
	dir := b.templateDir(templateID)
	b.dropTemplateRAM(dir + string(filepath.Separator))
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil
	}
	unlock, err := fsutil.Flock(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	os.Remove(filepath.Dir(dir)) // the template's directory, once it holds no build
	b.cfg.Log.Info("vm template cache removed", "template", templateID)
	return nil
}
