package vm

import (
	"bufio"
	"fmt"
	"io"
	"syscall"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an
// initramfs (Documentation/driver-api/early-userspace/buffer-format.rst).
// It is small enough that a dependency would not pay for itself, and the
// boot tests exercise it against the real kernel.
type cpioWriter struct {
	w   *bufio.Writer
	ino int
	n   int64
	err error
}

func newCpioWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: bufio.NewWriter(w), ino: 1} }

func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor int, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) dir(name string) { c.entry(name, syscall.S_IFDIR|0o755, 0, 0, nil) }
func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, syscall.S_IFREG|perm, 0, 0, data)
}
func (c *cpioWriter) charDev(name string, perm uint32, major, minor int) {
	c.entry(name, syscall.S_IFCHR|perm, major, minor, nil)
}

// close writes the trailer and flushes.
func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
