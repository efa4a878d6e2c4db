package vm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
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
// snapshot and shared by its vms (as the page cache of the file was).

// sealedRAM is one template snapshot's RAM, sealed.
type sealedRAM struct {
	f        *os.File
	dev, ino uint64 // the file it was copied from
}

// ramSeals are the seals a template RAM memfd carries.
const ramSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// templateRAM returns snapshot s's RAM as a write-sealed memfd.
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
			return r.f, nil
		}
		r.f.Close() // the snapshot was made again: vms started from the old copy keep theirs
		delete(b.rams, s.mem)
	}
	f, err := sealedCopy(s.mem)
	if err != nil {
		return nil, fmt.Errorf("template snapshot RAM: %w", err)
	}
	b.rams[s.mem] = &sealedRAM{f: f, dev: uint64(st.Dev), ino: st.Ino}
	return f, nil
}

// sealedCopy copies a file into a memfd, keeping it sparse (holes and
// zero pages are not copied: the guest never touched them), and seals it.
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
	size := fi.Size()
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
	if err := f.Truncate(size); err != nil {
		return nil, err
	}
	buf := make([]byte, 1<<20)
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return nil, fmt.Errorf("seek data in %s: %w", path, err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole in %s: %w", path, err)
		}
		for p := data; p < hole; {
			n, err := src.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			if n == 0 && err != nil {
				return nil, fmt.Errorf("read %s: %w", path, err)
			}
			if !bytes.Equal(buf[:n], zeroPage[:n]) {
				if _, err := f.WriteAt(buf[:n], p); err != nil {
					return nil, err
				}
			}
			p += int64(n)
		}
		off = hole
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, ramSeals); err != nil {
		return nil, fmt.Errorf("seal the template RAM: %w", err)
	}
	// The copy is what vms use: the file's pages need not stay cached too.
	unix.Fadvise(sfd, 0, 0, unix.FADV_DONTNEED)
	return f, nil
}

var zeroPage = make([]byte, 1<<20)
