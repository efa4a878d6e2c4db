package vm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A template snapshot's RAM file is what every vm of that template starts
// from: each maps it copy-on-write, and pages a vm has not written yet are
// read from it. A QEMU that could write it (a guest that escapes into its
// QEMU: TCG is no security boundary) would change every later vm of the
// template and the unwritten pages of its running siblings. QEMU 7.2
// opens a memory-backend-file read-write whatever its share= (its
// readonly=on maps the guest's RAM read-only, a ROM the guest cannot
// run on), and it punches holes into the file when the guest gives
// memory back. So no QEMU ever gets the file: it gets a copy in a memfd
// sealed against every write (F_SEAL_WRITE, _SHRINK, _GROW, then
// F_SEAL_SEAL), which it may open read-write and map private, but whose
// contents no write, shared mapping, truncate or hole punch can change,
// whoever holds it. The copy is made once per daemon and template
// snapshot and shared by its vms (as the page cache of the file was),
// every page of it allocated (a hole a vm touched would be charged to
// that vm's memory cgroup, beside its private copy of the page).

// sealedRAM is one template snapshot's RAM, sealed.
type sealedRAM struct {
	f        *os.File
	dev, ino uint64 // the file it was copied from
}

// ramSeals are the seals a template RAM memfd carries.
const ramSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// templateRAM returns snapshot s's RAM as a write-sealed memfd (a
// descriptor of the caller's own, to close).
func (b *Backend) templateRAM(s *snapshot) (*os.File, error) {
	fi, err := os.Stat(s.mem)
	if err != nil {
		return nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	b.ramMu.Lock()
	defer b.ramMu.Unlock()
	if r := b.rams[s.mem]; r != nil {
		if r.dev == uint64(st.Dev) && r.ino == st.Ino {
			return dupFile(r.f)
		}
		r.f.Close() // the snapshot was made again: vms started from the old copy keep theirs
		delete(b.rams, s.mem)
	}
	f, err := sealedCopy(s.mem)
	if err != nil {
		return nil, fmt.Errorf("template snapshot RAM: %w", err)
	}
	b.rams[s.mem] = &sealedRAM{f: f, dev: uint64(st.Dev), ino: st.Ino}
	return dupFile(f)
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// dropTemplateRAM forgets the sealed copies of snapshots under dir (a
// template being removed); running vms keep the copy they map.
func (b *Backend) dropTemplateRAM(dir string) {
	b.ramMu.Lock()
	defer b.ramMu.Unlock()
	for path, r := range b.rams {
		if strings.HasPrefix(path, dir) {
			r.f.Close()
			delete(b.rams, path)
		}
	}
}

// newRAM is an empty memfd of size bytes for a template boot's RAM.
func newRAM(size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("nook-template-boot-ram", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:nook-template-boot-ram")
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// writeRAM writes a template boot's RAM to the snapshot's file (root's,
// read-only), synced.
func writeRAM(ram *os.File, path string) error {
	fi, err := ram.Stat()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o400)
	if err != nil {
		return err
	}
	if err := f.Truncate(fi.Size()); err != nil {
		f.Close()
		return err
	}
	if err := copySparse(f, ram, fi.Size()); err != nil {
		f.Close()
		return fmt.Errorf("write the template RAM: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// sealedCopy copies a file into a memfd and seals it.
func sealedCopy(path string) (_ *os.File, err error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("nook-template-ram", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:nook-template-ram")
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := f.Truncate(fi.Size()); err != nil {
		return nil, err
	}
	// Every page of the copy is made now, zero where the file is zero: a
	// hole a QEMU touched through its private mapping would become a page
	// of the memfd charged to that vm's memory cgroup (and kept when it
	// ends) beside the private copy a write makes, so that a vm whose
	// guest used more than about half its RAM was killed at its limit.
	// The template's RAM is then the daemon's, once, and a vm's cgroup
	// holds only the pages its guest wrote.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, fi.Size()); err != nil {
		return nil, fmt.Errorf("allocate the template RAM copy (%d MiB): %w", fi.Size()>>20, err)
	}
	if err := copySparse(f, src, fi.Size()); err != nil {
		return nil, err
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, ramSeals); err != nil {
		return nil, fmt.Errorf("seal the template RAM: %w", err)
	}
	// The copy is what vms use: the file's pages need not stay cached too.
	unix.Fadvise(int(src.Fd()), 0, 0, unix.FADV_DONTNEED)
	return f, nil
}

// copySparse copies the first size bytes of src into dst (as long, and
// empty), keeping it sparse: holes and zero blocks (memory the guest
// never touched) are not written.
func copySparse(dst, src *os.File, size int64) error {
	buf := make([]byte, 1<<20)
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", src.Name(), err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src.Name(), err)
		}
		hole = min(hole, size)
		for p := data; p < hole; {
			n, err := src.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			if n == 0 && err != nil {
				return fmt.Errorf("read %s: %w", src.Name(), err)
			}
			if !bytes.Equal(buf[:n], zeroPage[:n]) {
				if _, err := dst.WriteAt(buf[:n], p); err != nil {
					return err
				}
			}
			p += int64(n)
		}
		off = hole
	}
	return nil
}

var zeroPage = make([]byte, 1<<20)
