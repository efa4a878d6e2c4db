// Package volume keeps named volumes: data that outlives any sandbox and
// that several sandboxes mount at once.
//
// A volume is a directory of the store, <dir>/<name>/, holding its
// record (volume.json: name, size, creation time), its ext4 image
// (disk.img, sparse: internal/diskimg) and the image's mount point
// (mnt/). The volume's files are mnt/data/ (mnt/ itself keeps ext4's
// lost+found out of sight). The size is the image's: a writer past it
// gets ENOSPC. The image is sparse, as a container's disk is: it takes
// the host's space as its files are written (a create checks that the
// host has its size free then, but sizes promised are not reserved).
//
// Create makes the image and the record in a temporary directory
// (.new-*) and renames it into place, then mounts it; Remove renames
// the volume to .gone-* first, then unmounts and deletes it. Open
// finishes both after a crash (a .new-* directory is removed, a .gone-*
// one unmounted and removed) and mounts what a host restart unmounted,
// so a kill -9 at any point leaves a volume whole or gone. Mounts
// outlive the daemon: a volume mounted in a sandbox stays mounted.
//
// files.go reads and writes a volume's files without a sandbox, through
// an os.Root on them: no name, symlink or ".." a sandbox left there
// leads the daemon out of the volume.
//
// remote.go carries out a vm's volume calls (its guest mounts each
// volume as a FUSE file system its agent serves; the protocol is in the
// agent package's volume.go) through the same kind of os.Root: every
// call names a path, so nothing is kept per vm but the open roots and a
// few directory cursors (a listing's next page). The guest is untrusted:
// it may set any owner and mode, as a container's root may, and nothing
// more: no device or fifo is made or opened, a path ending in a symlink
// is not followed for a read or a write (the guest's kernel follows
// symlinks itself), and a read-only mount refuses every change here.
//
// The store knows nothing of sandboxes: the daemon records which
// sandbox mounts which volume and refuses to remove one in use.
package volume
