package cli

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
)

// screen is a terminal that knows what buildView writes: text, newlines,
// "ESC [ n F" (up n lines, to their start) and "ESC [ J" (erase to the
// end of the screen).
type screen struct {
	rows []string
	row  int
}

func (s *screen) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == 0x1b:
			j := i + 2
			for j < len(p) && p[j] >= '0' && p[j] <= '9' {
				j++
			}
			n, _ := strconv.Atoi(string(p[i+2 : j]))
			switch p[j] {
			case 'F':
				s.row -= n
			case 'J':
				s.rows = s.rows[:s.row]
			}
			i = j
		case c == '\n':
			s.row++
		default:
			for len(s.rows) <= s.row {
				s.rows = append(s.rows, "")
			}
			s.rows[s.row] += string(c)
		}
	}
	return len(p), nil
}

func (s *screen) text() string {
	return strings.Join(s.rows[:min(s.row, len(s.rows))], "\n")
}

// On a terminal, layers on their way have bars under the build's lines,
// redrawn in place; a layer done loses its bar, and once the build ends
// the screen holds its lines alone. Elsewhere only the lines are printed.
func TestBuildView(t *testing.T) {
	pull := func(i int, got int64) api.BuildEvent {
		return api.BuildEvent{Pulling: &api.BuildPullEvent{Index: i, Count: 2, Digest: "sha256:" + strings.Repeat(strconv.Itoa(i), 64), Size: 1e6, Received: got}}
	}
	events := []api.BuildEvent{
		{Progress: "resolving r"},
		pull(0, 0), pull(0, 5e5), pull(1, 1e5),
		{Progress: "a line while they come"},
		pull(0, 1e6), pull(1, 9e5),
		{Layer: &api.BuildLayerEvent{Index: 0}}, {Progress: "layer 1/2 done"},
		{Layer: &api.BuildLayerEvent{Index: 1}}, {Progress: "layer 2/2 done"},
		{Template: &api.Template{}},
	}
	scr := &screen{}
	v := &buildView{w: scr, tty: true, live: map[int]api.BuildPullEvent{}}
	for i, ev := range events {
		v.event(ev)
		if i == 6 {
			want := "resolving r\na line while they come\n" +
				"layer 1/2 000000000000 [==============================]    1.0/1.0 MB\n" +
				"layer 2/2 111111111111 [===========================>  ]    0.9/1.0 MB"
			if got := scr.text(); got != want {
				t.Fatalf("while two layers come the screen is:\n%s\nwant:\n%s", got, want)
			}
		}
	}
	v.finish()
	if got, want := scr.text(), "resolving r\na line while they come\nlayer 1/2 done\nlayer 2/2 done"; got != want {
		t.Fatalf("after the build the screen is:\n%s\nwant:\n%s", got, want)
	}

	// A build that fails mid-pull leaves no bar.
	scr = &screen{}
	v = &buildView{w: scr, tty: true, live: map[int]api.BuildPullEvent{}}
	v.event(pull(0, 10))
	v.finish()
	if got := scr.text(); got != "" {
		t.Fatalf("a bar is left: %q", got)
	}

	var plain bytes.Buffer
	v = newBuildView(&plain)
	for _, ev := range events {
		v.event(ev)
	}
	v.finish()
	if got, want := plain.String(), "resolving r\na line while they come\nlayer 1/2 done\nlayer 2/2 done\n"; got != want {
		t.Fatalf("not a terminal: %q, want %q", got, want)
	}
}
