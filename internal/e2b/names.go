package e2b

import (
	"bufio"
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// envd names a file's owner and group as the sandbox does; nook's file
// API gives numbers. The edge reads the sandbox's /etc/passwd and
// /etc/group (files the sandbox controls: parsed as text, bounded, used
// only in answers to its own callers) and keeps them a few seconds.

// namesTTL is how long a sandbox's names are kept.
const namesTTL = 10 * time.Second

// maxNamesFile bounds what is read of /etc/passwd or /etc/group.
const maxNamesFile = 1 << 20

// idNames maps a sandbox's uids and gids to names; a nil one names only
// root.
type idNames struct {
	users, groups map[int]string
	at            time.Time
}

func (n *idNames) user(id int) string {
	return n.name(id, func(n *idNames) map[int]string { return n.users })
}
func (n *idNames) group(id int) string {
	return n.name(id, func(n *idNames) map[int]string { return n.groups })
}

func (n *idNames) name(id int, table func(*idNames) map[int]string) string {
	if n != nil {
		if s, ok := table(n)[id]; ok {
			return s
		}
	}
	if id == 0 {
		return "root"
	}
	return strconv.Itoa(id)
}

// nameCache keeps each sandbox's names, by sandbox ID.
type nameCache struct {
	mu sync.Mutex
	m  map[string]*idNames
}

// names is the sandbox's uid and gid names, read again after namesTTL;
// nil (numbers) if they cannot be read.
func (s *Server) names(ctx context.Context, t target) *idNames {
	s.nameCache.mu.Lock()
	n := s.nameCache.m[t.sb.ID]
	s.nameCache.mu.Unlock()
	if n != nil && time.Since(n.at) < namesTTL {
		return n
	}
	n = &idNames{users: s.readNames(ctx, t, "/etc/passwd"), groups: s.readNames(ctx, t, "/etc/group"), at: time.Now()}
	if n.users == nil && n.groups == nil {
		return nil // not kept: the next call reads again
	}
	s.nameCache.mu.Lock()
	if s.nameCache.m == nil {
		s.nameCache.m = map[string]*idNames{}
	}
	for id, old := range s.nameCache.m { // the cache holds only fresh entries
		if time.Since(old.at) >= namesTTL {
			delete(s.nameCache.m, id)
		}
	}
	s.nameCache.m[t.sb.ID] = n
	s.nameCache.mu.Unlock()
	return n
}

// readNames reads NAME:x:ID:... lines of a passwd or group file.
func (s *Server) readNames(ctx context.Context, t target, file string) map[int]string {
	_, rc, err := s.m.ReadFile(ctx, t.sb.Name, file, 0, maxNamesFile)
	if err != nil {
		return nil
	}
	defer rc.Close()
	return parseNames(io.LimitReader(rc, maxNamesFile))
}

// parseNames reads the names and ids of a passwd or group file: the
// first name given an id wins, as getpwuid finds it.
func parseNames(r io.Reader) map[int]string {
	out := map[int]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), ":", 4)
		if len(f) < 3 || f[0] == "" || strings.HasPrefix(f[0], "#") {
			continue
		}
		id, err := strconv.Atoi(f[2])
		if err != nil || id < 0 {
			continue
		}
		if _, ok := out[id]; !ok {
			out[id] = f[0]
		}
	}
	return out
}
