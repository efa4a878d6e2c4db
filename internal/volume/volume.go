package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/diskimg"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

// Sizes a volume may have.
const (
	DefaultSize = 10 << 30
	MinSize     = 64 << 20 // ext4's metadata and journal take about 5 MiB of a small one
)

// Volume is a volume's record.
type Volume struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// UsedBytes is what its files take now (not recorded: measured).
	UsedBytes int64 `json:"-"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// CheckName returns an ErrInvalidArgument unless name can name a volume.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalid("volume name %q is not valid: lowercase letters, digits and -, at most 63, starting with a letter or digit", name)
	}
	return nil
}

// Store is the volumes of one directory.
type Store struct {
	dir string
	log *slog.Logger

	mu    sync.Mutex
	locks map[string]*sync.Mutex // by name: create and remove of one volume
}

// Open opens the store at dir (made, root's alone), finishes what a
// crash interrupted and mounts every volume that is not.
func Open(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, log: log, locks: map[string]*sync.Mutex{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), ".new-"), strings.HasPrefix(e.Name(), ".gone-"):
			if err := s.drop(p); err != nil {
				log.Warn("remove what a crash left of a volume", "dir", p, "err", err)
			}
		case CheckName(e.Name()) == nil:
			if _, err := s.mount(e.Name()); err != nil {
				log.Warn("mount volume", "volume", e.Name(), "err", err)
			}
		}
	}
	return s, nil
}

func (s *Store) lock(name string) func() {
	s.mu.Lock()
	l := s.locks[name]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[name] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Create makes volume name of size bytes (0: DefaultSize), mounted.
func (s *Store) Create(ctx context.Context, name string, size int64) (Volume, error) {
	if err := CheckName(name); err != nil {
		return Volume{}, err
	}
	if size == 0 {
		size = DefaultSize
	}
	size &^= 1<<20 - 1
	if size < MinSize {
		return Volume{}, errdefs.Invalid("a volume is at least %d MiB", MinSize>>20)
	}
	var fsst unix.Statfs_t
	if unix.Statfs(s.dir, &fsst) == nil && size > int64(fsst.Bavail)*fsst.Bsize {
		return Volume{}, errdefs.Invalid("volume size %d MiB is more than %s has free (%d MiB)", size>>20, s.dir, int64(fsst.Bavail)*fsst.Bsize>>20)
	}
	defer s.lock(name)()
	final := filepath.Join(s.dir, name)
	if _, err := os.Lstat(final); err == nil {
		return Volume{}, errdefs.Exists("volume %s already exists", name)
	}
	tmp := filepath.Join(s.dir, ".new-"+name+"-"+random())
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return Volume{}, err
	}
	defer os.RemoveAll(tmp) // gone once renamed
	v := Volume{Name: name, SizeBytes: size, CreatedAt: time.Now().UTC()}
	if err := diskimg.Make(ctx, filepath.Join(tmp, "disk.img"), size, "volume "+name); err != nil {
		return Volume{}, err
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(tmp, "volume.json"), v); err != nil {
		return Volume{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return Volume{}, err
	}
	if _, err := s.mount(name); err != nil {
		s.remove(name)
		return Volume{}, err
	}
	s.log.Info("volume created", "volume", name, "size", size)
	return v, nil
}

// mount mounts volume name unless it is, makes its files' directory
// (ext4's lost+found stays out of sight; 0755 root's, as a fresh disk's
// root is) unless it is there (a crash between the create's rename and
// its mkdir), and returns that directory. The caller holds name's lock
// (or is Open, before anything else runs): one image is never mounted
// twice.
func (s *Store) mount(name string) (string, error) {
	dir := filepath.Join(s.dir, name)
	mnt := filepath.Join(dir, "mnt")
	if err := diskimg.Mount(filepath.Join(dir, "disk.img"), mnt, "volume "+name); err != nil {
		return "", err
	}
	data := filepath.Join(mnt, "data")
	if err := os.Mkdir(data, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return data, nil
}

// Get returns volume name.
func (s *Store) Get(name string) (Volume, error) {
	if err := CheckName(name); err != nil {
		return Volume{}, err
	}
	var v Volume
	if err := fsutil.ReadJSON(filepath.Join(s.dir, name, "volume.json"), &v); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Volume{}, errdefs.NotFound("volume %s not found", name)
		}
		return Volume{}, fmt.Errorf("volume %s: %w", name, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(s.dir, name, "mnt", "data"), &st); err == nil {
		v.UsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
	}
	return v, nil
}

// List returns every volume, by name.
func (s *Store) List() ([]Volume, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []Volume
	for _, e := range entries {
		if CheckName(e.Name()) != nil {
			continue
		}
		if v, err := s.Get(e.Name()); err == nil {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Path is the directory of volume name's files, mounted (again, after a
// host restart) if it is not.
func (s *Store) Path(name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	defer s.lock(name)()
	if _, err := s.Get(name); err != nil {
		return "", err
	}
	return s.mount(name)
}

// Remove deletes volume name and its files. The caller makes sure no
// sandbox mounts it.
func (s *Store) Remove(ctx context.Context, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	defer s.lock(name)()
	if _, err := s.Get(name); err != nil {
		return err
	}
	return s.remove(name)
}

func (s *Store) remove(name string) error {
	gone := filepath.Join(s.dir, ".gone-"+name+"-"+random())
	if err := os.Rename(filepath.Join(s.dir, name), gone); err != nil {
		return err
	}
	if err := s.drop(gone); err != nil {
		return err
	}
	s.log.Info("volume removed", "volume", name)
	return nil
}

// drop unmounts and removes a volume directory out of the store's names.
func (s *Store) drop(dir string) error {
	attached, err := diskimg.Unmounted(filepath.Join(dir, "mnt"), filepath.Join(dir, "disk.img"))
	if err != nil {
		return err
	}
	if attached {
		s.log.Warn("a removed volume's loop device is still attached (it detaches when nothing holds it)", "dir", dir)
	}
	return os.RemoveAll(dir)
}

func random() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
