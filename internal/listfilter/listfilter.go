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
package listfilter

import (
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
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
		for _, v := range vs {
			if v == "" {
				return nil, errdefs.Invalid("filter %s has no value: give %s=VALUE", k, k)
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
