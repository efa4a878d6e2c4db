// Package layerstore turns image layers into overlay lower directories
// (issue 14: templates from OCI images). Unpack applies one layer's tar
// stream to an empty directory in the format overlayfs reads, so that a
// stack of such directories, given to an overlay mount as its lowers, is
// the image's root filesystem. A Store keeps them, one directory per
// chain ID (a layer's result depends on the layers under it), and Ensure
// makes one: under a lock file, so that concurrent builds unpack a layer
// once; into a temporary directory renamed into place only once the
// stored bytes and the tar matched their digests over every byte (the
// registry client checks a blob's digest at its end, so a registry's
// blob, Blob.Verified, is not hashed twice; archives and layouts are
// hashed here) and the layer is on disk; gzip, zstd or plain. Nothing is
// left of a layer that failed; Open removes what a crash cut short. A
// Batch unpacks an image's layers, each over the temporary directories
// of those below it, and syncs them once before it names them all: one
// wait for the disk per image, not one per layer.
//
// An unpack is two goroutines joined by a chunkPipe (1 MiB chunks, a
// few in flight): one reads, decompresses and hashes the blob and its
// tar, the other writes the tar to disk, so that on two cores they
// overlap; each file of 256 KiB or more has its writeback started as
// soon as it is written, so that the sync before the rename finds little
// to do.
// Prefetch reads the next layer of an image (up to a bound) while one
// unpacks. On this project's test
// machines the root file system is ext4 without a journal, which skips,
// one by one, the inodes freed in the last minutes when it picks one for
// a new file: a layer unpacked among many files removed just before
// costs several times more (BENCHMARKS.md). The store's directory is
// marked a top directory (chattr +T, fsutil.MarkTopDir), so that each
// layer's directory starts in a block group of its own choosing, with
// free inodes above the average, instead of beside the store's, where
// the layers removed before it were.
//
// A layer comes from a registry, an archive or a build step: nothing in
// it is trusted. Every entry is created through file descriptors, below
// the layer's directory:
//   - names are cleaned (a leading "/" or "./" is dropped, as Docker and
//     containerd do); one that still climbs with ".." is refused
//     (ErrUnsafe);
//   - the parent directory is opened with openat2(RESOLVE_BENEATH |
//     RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV): an
//     entry below a symlink, even one of this layer pointing inside it, is
//     refused, and no write can land outside the layer whatever the
//     entries before it made;
//   - the entry itself is made with *at calls on that descriptor, never
//     followed if it is a symlink (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW);
//     symlink targets are stored as they are, since nothing on the host
//     follows them;
//   - a hard link's target is resolved the same way; one outside the
//     layer, through a symlink or to a directory is refused, and one
//     whose target an earlier layer holds is copied up from the lowers
//     (Options.Lowers) first, as real `docker save` output needs: the
//     file the lowers' merged view shows there (whiteouts and opaque
//     directories of higher lowers hide lower ones), typed through an
//     O_PATH descriptor before it is opened, so that no fifo or device
//     node of a layer is ever opened on the host.
//
// Whiteouts (OCI image-spec layer.md) become overlay's: ".wh.NAME" a 0:0
// character device NAME, ".wh..wh..opq" the trusted.overlay.opaque
// xattr on its directory, and a directory that replaces a whiteout of
// the same layer is opaque too. Owners are kept as the tar has them
// (0-based: a sandbox's idmapped mount shifts them). Of the extended
// attributes only user.*, security.capability and POSIX ACLs are kept;
// trusted.overlay.* (which would steer overlay's lookups: redirects,
// metacopy) and the rest are dropped and counted. Device nodes and
// fifos are created as given (sandboxes mount their root nodev; the
// store must be root's alone); other entry types fail the layer.
// Options.MaxBytes bounds what a layer makes, against a decompression
// bomb: its file data, and a fixed cost for each entry and each
// directory made for one. A name deeper than MaxDepth is refused. The
// result depends on the lowers (copied-up files, inherited directory
// metadata): a store keys an unpacked layer by its chain ID, never by
// its diff ID alone.
//
// Merge makes a template's rootfs from a stack of stored layers: the view
// an overlay mount of them shows (whiteouts and opaque directories
// applied, each directory's metadata its topmost layer's), its files hard
// links to the stored inodes and its directories made fresh, written
// through descriptors below the rootfs that never follow a symlink. The
// template test checks it against an overlay mount of the same layers.
package layerstore
