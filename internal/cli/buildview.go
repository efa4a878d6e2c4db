package cli

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/nookhq/nook/api"
)

// buildView shows a template build's progress. On a terminal it prints
// the build's lines as they come and, under them, a line with a bar for
// each image layer on its way, redrawn in place as its bytes come (what
// docker pull shows); elsewhere (a pipe, a file, TERM=dumb) it prints
// the lines alone.
type buildView struct {
	w     io.Writer
	tty   bool
	live  map[int]api.BuildPullEvent // layers on their way, by index
	drawn int                        // lines of bars on the screen, under the cursor's line
}

func newBuildView(w io.Writer) *buildView {
	f, ok := w.(*os.File)
	return &buildView{w: w, tty: ok && isTerminal(f) && os.Getenv("TERM") != "dumb", live: map[int]api.BuildPullEvent{}}
}

// event shows one event of the build's stream.
func (v *buildView) event(ev api.BuildEvent) {
	if !v.tty {
		if ev.Progress != "" {
			fmt.Fprintln(v.w, tsafe(ev.Progress))
		}
		return
	}
	if ev.Pulling != nil {
		v.live[ev.Pulling.Index] = *ev.Pulling
	}
	if ev.Layer != nil {
		delete(v.live, ev.Layer.Index)
	}
	if ev.Template != nil || ev.Error != nil {
		clear(v.live)
	}
	v.redraw(ev.Progress)
}

// finish takes the bars off the screen (a build that failed mid-pull).
func (v *buildView) finish() {
	if v.tty {
		clear(v.live)
		v.redraw("")
	}
}

// redraw erases the bars, prints line (if any) where they were and the
// bars again under it, in one write.
func (v *buildView) redraw(line string) {
	var b strings.Builder
	if v.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dF\x1b[J", v.drawn) // up to the first bar's line, erase to the end
	}
	if line != "" {
		b.WriteString(tsafe(line))
		b.WriteByte('\n')
	}
	idx := make([]int, 0, len(v.live))
	for i := range v.live {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		b.WriteString(pullBar(v.live[i]))
		b.WriteByte('\n')
	}
	v.drawn = len(idx)
	if b.Len() > 0 {
		io.WriteString(v.w, b.String())
	}
}

// pullBar is a layer's line: "layer 2/3 0123456789ab [=====>    ]  12.3/16.8 MB".
func pullBar(p api.BuildPullEvent) string {
	const width = 30
	done := 0
	if p.Size > 0 {
		done = int(min(max(p.Received, 0), p.Size) * width / p.Size)
	}
	bar := strings.Repeat("=", done)
	if done < width {
		bar += ">" + strings.Repeat(" ", width-done-1)
	}
	d := strings.TrimPrefix(p.Digest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return fmt.Sprintf("layer %d/%d %s [%s] %6.1f/%.1f MB", p.Index+1, p.Count, tsafe(d), bar, float64(p.Received)/1e6, float64(p.Size)/1e6)
}
