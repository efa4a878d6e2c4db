// Package listfilter reads and applies the filters of nook's lists: the
// KEY=VALUE pairs of `nook ls --filter` and the query parameters of
// GET /v1/sandboxes. Keys:
//
//	label=K=V   the sandbox has label K with value V
//	label=K     the sandbox has label K (any value)
//	state=S     its state is S (running, paused, stopped, creating, failed, destroying)
//	template=T  it was created from template T
//	isolation=I its isolation is I (container or vm)
//	name=GLOB   its name matches GLOB (path.Match: * ? [...]); a value
//	            without a wildcard matches names that start with it
//
// Different keys must all match; the values of one key repeated are
// alternatives (state=running,state=paused: either), except label, whose
// repeats must all match. Other lists (snapshots, templates, volumes,
// tokens) take name only.
//
// Matching costs the daemon work for every sandbox, so a filter is
// bounded: at most MaxValues values of one key, each at most
// MaxValueBytes long (a label's at most MaxLabelBytes, enough for any
// label; a name's at most MaxNameBytes, twice the longest name).
package listfilter

import (
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// Bounds of a filter: path.Match costs the pattern's length times the
// name's for each sandbox and pattern.
const (
	MaxValues     = 16                                                  // values of one key
	MaxValueBytes = 256                                                 // a state, template or isolation value
	MaxLabelBytes = core.MaxLabelKeyBytes + 1 + core.MaxLabelValueBytes // label=K=V: compared, not matched
	MaxNameBytes  = 2 * core.MaxNameLen                                 // name=GLOB
)

// SandboxKeys are the keys a sandbox list takes; NameKeys those of the
// lists that filter by name only.
var (
	SandboxKeys = []string{"label", "state", "template", "isolation", "name"}
	NameKeys    = []string{"name"}
)

// States are the values state takes.
var States = []string{api.StateRunning, api.StatePaused, api.StateStopped, api.StateCreating, api.StateFailed, api.StateDestroying}

// Filter is a parsed set of conditions; the zero Filter matches all.
type Filter struct {
	labels     []label
	states     []string
	templates  []string
	isolations []string
	names      []string
}

type label struct {
	key, value string
	any        bool // label=K: any value
}

// Empty reports whether f matches everything.
func (f *Filter) Empty() bool {
	return f == nil || len(f.labels)+len(f.states)+len(f.templates)+len(f.isolations)+len(f.names) == 0
}

// Parse reads KEY=VALUE pairs (each may hold several joined by commas,
// as `--filter label=team=a,state=paused`), taking only the keys allowed.
// Its errors are errdefs.ErrInvalidArgument and name the allowed keys.
func Parse(pairs []string, allowed []string) (*Filter, error) {
	_, f, err := parse(pairs, allowed)
	return f, err
}

// Pairs checks pairs as Parse does and returns them one KEY=VALUE each,
// split at their commas: what a client sends the daemon.
func Pairs(pairs []string, allowed []string) ([]string, error) {
	out, _, err := parse(pairs, allowed)
	return out, err
}

func parse(pairs []string, allowed []string) ([]string, *Filter, error) {
	var out []string
	q := url.Values{}
	for _, p := range pairs {
		for _, part := range Split(p, allowed) {
			k, v, ok := strings.Cut(part, "=")
			if !ok {
				return nil, nil, errdefs.Invalid("filter %q: give KEY=VALUE with KEY one of %s", part, strings.Join(allowed, ", "))
			}
			q.Add(k, v)
			out = append(out, part)
		}
	}
	f, err := FromQuery(q, allowed)
	if err != nil {
		return nil, nil, err
	}
	return out, f, nil
}

// Split cuts one --filter value at the commas that start another
// allowed KEY=: "label=a=x,y,state=paused" is "label=a=x,y" and
// "state=paused", so a label value may hold a comma.
func Split(s string, allowed []string) []string {
	var out []string
	for _, seg := range strings.Split(s, ",") {
		k, _, ok := strings.Cut(seg, "=")
		if len(out) > 0 && (!ok || !slices.Contains(allowed, k)) {
			out[len(out)-1] += "," + seg
			continue
		}
		out = append(out, seg)
	}
	return out
}

// FromQuery reads a list request's query parameters, taking only the
// keys allowed: any other parameter is an error naming them.
func FromQuery(q url.Values, allowed []string) (*Filter, error) {
	f := &Filter{}
	for k, vs := range q {
		if !slices.Contains(allowed, k) {
			return nil, errdefs.Invalid("unknown filter %q: the filters are %s", k, strings.Join(allowed, ", "))
		}
		if len(vs) > MaxValues {
			return nil, errdefs.Invalid("filter %s is given %d times: at most %d", k, len(vs), MaxValues)
		}
		for _, v := range vs {
			if v == "" {
				return nil, errdefs.Invalid("filter %s has no value: give %s=VALUE", k, k)
			}
			limit := MaxValueBytes
			switch k {
			case "label":
				limit = MaxLabelBytes
			case "name":
				limit = MaxNameBytes
			}
			if len(v) > limit {
				return nil, errdefs.Invalid("filter %s: a value of %d bytes, more than the %d allowed", k, len(v), limit)
			}
			switch k {
			case "label":
				key, val, ok := strings.Cut(v, "=")
				if key == "" {
					return nil, errdefs.Invalid("filter label=%s: give label=KEY=VALUE or label=KEY", v)
				}
				f.labels = append(f.labels, label{key: key, value: val, any: !ok})
			case "state":
				if !slices.Contains(States, v) {
					return nil, errdefs.Invalid("filter state=%s: the states are %s", v, strings.Join(States, ", "))
				}
				f.states = append(f.states, v)
			case "template":
				f.templates = append(f.templates, v)
			case "isolation":
				f.isolations = append(f.isolations, v)
			case "name":
				if _, err := path.Match(v, ""); err != nil {
					return nil, errdefs.Invalid("filter name=%s: %v", v, err)
				}
				f.names = append(f.names, v)
			}
		}
	}
	return f, nil
}

// Sandbox reports whether a sandbox (as the API shows it) matches.
func (f *Filter) Sandbox(sb *api.Sandbox) bool {
	if f.Empty() {
		return true
	}
	for _, l := range f.labels {
		v, ok := sb.Labels[l.key]
		if !ok || (!l.any && v != l.value) {
			return false
		}
	}
	return oneOf(f.states, sb.State) && oneOf(f.templates, sb.Template) && oneOf(f.isolations, sb.Isolation) && f.Name(sb.Name)
}

// Name reports whether a name matches the name filters (true if none).
func (f *Filter) Name(name string) bool {
	if f == nil || len(f.names) == 0 {
		return true
	}
	for _, p := range f.names {
		if !strings.ContainsAny(p, `*?[\`) {
			if strings.HasPrefix(name, p) {
				return true
			}
			continue
		}
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func oneOf(want []string, got string) bool {
	return len(want) == 0 || slices.Contains(want, got)
}
