package dockerignore

import "testing"

func TestExcluded(t *testing.T) {
	m, err := Parse([]byte("# comment\n*.env\n/build\nsrc/**/*.tmp\n!keep.env\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"a.env": true, "keep.env": false, "build": true, "build/x": true, "src/a/b/c.tmp": true, "src/main.go": false, ".": false} {
		if got := m.Excluded(p); got != want {
			t.Errorf("%s: %v, want %v", p, got, want)
		}
	}
	var none *Matcher
	if none.Excluded("a.env") {
		t.Error("no .dockerignore excludes nothing")
	}
}

// FuzzParse: whatever a context's .dockerignore holds, reading it and
// matching with it end with an answer.
func FuzzParse(f *testing.F) {
	f.Add([]byte("*.env\n!keep.env\n"), "a/b.env")
	f.Fuzz(func(t *testing.T, b []byte, p string) {
		if m, err := Parse(b); err == nil {
			m.Excluded(p)
		}
	})
}
