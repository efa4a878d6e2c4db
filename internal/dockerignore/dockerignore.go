// Package dockerignore reads a build context's .dockerignore into a
// matcher of the paths it excludes, as Docker reads it (patterns of
// github.com/moby/patternmatcher, "!" taking back, "#" comments). The CLI
// leaves excluded files out of the context it sends; the daemon leaves
// them out of what COPY and ADD see, whatever a client sent.
package dockerignore

import (
	"bufio"
	"bytes"
	"path/filepath"
	"strings"

	"github.com/moby/patternmatcher"
)

// Matcher reports whether a context path (slash-separated, relative to
// the context) is excluded.
type Matcher struct {
	pm *patternmatcher.PatternMatcher
}

// Parse reads .dockerignore's text.
func Parse(b []byte) (*Matcher, error) {
	var pats []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		neg := strings.HasPrefix(l, "!")
		l = filepath.Clean(strings.TrimPrefix(strings.TrimPrefix(l, "!"), "/"))
		if neg {
			l = "!" + l
		}
		pats = append(pats, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	pm, err := patternmatcher.New(pats)
	if err != nil {
		return nil, err
	}
	return &Matcher{pm: pm}, nil
}

// Excluded reports whether rel, or a directory above it, is excluded
// (and not taken back by a later "!" pattern).
func (m *Matcher) Excluded(rel string) bool {
	if m == nil || rel == "." || rel == "" {
		return false
	}
	ok, err := m.pm.MatchesOrParentMatches(filepath.FromSlash(rel))
	return err == nil && ok
}
