package api

import (
	"fmt"
	"io/fs"
	"path"
	"syscall"
)

// NewFileInfo describes fi, found at p; readlink gives a symlink's
// target (read where the caller found it: a sandbox's path, a volume's
// root).
func NewFileInfo(p string, fi fs.FileInfo, readlink func() (string, error)) FileInfo {
	info := FileInfo{
		Path: p, Name: path.Base(p), Size: fi.Size(),
		Mode: fmt.Sprintf("%04o", ModeBits(fi.Mode())), ModTime: fi.ModTime().UTC(),
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = FileTypeFile
	case fi.IsDir():
		info.Type = FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		info.Type = FileTypeSymlink
		info.LinkTarget, _ = readlink()
	default:
		info.Type = FileTypeOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.UID, info.GID = int(st.Uid), int(st.Gid)
	}
	return info
}
