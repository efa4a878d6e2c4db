package listfilter

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

func TestSplit(t *testing.T) {
	for in, want := range map[string][]string{
		"label=team=a,state=paused": {"label=team=a", "state=paused"},
		"label=k=x,y,state=paused":  {"label=k=x,y", "state=paused"},
		"name=web-*":                {"name=web-*"},
		"state=running,bogus=1":     {"state=running,bogus=1"}, // not a key: part of the value
		",state=paused":             {"", "state=paused"},
	} {
		if got := Split(in, SandboxKeys); !slices.Equal(got, want) {
			t.Errorf("Split(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		"bogus=1":                              "unknown filter \"bogus\": the filters are label, state, template, isolation, name",
		"state":                                "give KEY=VALUE",
		"state=asleep":                         "the states are running, paused",
		"label==v":                             "give label=KEY=VALUE or label=KEY",
		"template=":                            "filter template has no value",
		"name=[a":                              "syntax error in pattern",
		"name=*" + strings.Repeat("[b-b]", 30): "more than the 126 allowed",
		"template=" + strings.Repeat("t", 257): "more than the 256 allowed",
		"label=k=" + strings.Repeat("v", 1200): "more than the 1153 allowed",
		strings.Repeat("state=running,", 17) + "state=paused": "filter state is given 18 times: at most 16",
	} {
		_, err := Parse([]string{in}, SandboxKeys)
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Parse(%q) = %v, want an invalid argument error with %q", in, err, want)
		}
	}
	// A label as long as a label may be is taken, and 16 names.
	if _, err := Parse([]string{"label=" + strings.Repeat("k", 128) + "=" + strings.Repeat("v", 1024), "name=" + strings.Repeat("a", 126)}, SandboxKeys); err != nil {
		t.Errorf("a filter within the bounds: %v", err)
	}
	if _, err := Parse([]string{strings.Repeat("name=a*,", 15) + "name=b*"}, NameKeys); err != nil {
		t.Errorf("16 names: %v", err)
	}
	if _, err := Parse([]string{"state=paused"}, NameKeys); err == nil || !strings.Contains(err.Error(), "the filters are name") {
		t.Errorf("state on a name-only list: %v", err)
	}
}

func TestSandbox(t *testing.T) {
	sbs := []api.Sandbox{
		{Name: "web-1", State: "running", Template: "base", Isolation: "container", Labels: map[string]string{"team": "a", "env": "prod"}},
		{Name: "web-2", State: "paused", Template: "dev", Isolation: "vm", Labels: map[string]string{"team": "b"}},
		{Name: "db", State: "stopped", Template: "base", Isolation: "container"},
	}
	for _, tc := range []struct {
		filters []string
		want    []string
	}{
		{nil, []string{"web-1", "web-2", "db"}},
		{[]string{"label=team=a"}, []string{"web-1"}},
		{[]string{"label=team"}, []string{"web-1", "web-2"}},
		{[]string{"label=team=a", "label=env=prod"}, []string{"web-1"}},
		{[]string{"label=team=a,label=env=dev"}, nil},
		{[]string{"state=paused"}, []string{"web-2"}},
		{[]string{"state=paused,state=stopped"}, []string{"web-2", "db"}},
		{[]string{"template=base"}, []string{"web-1", "db"}},
		{[]string{"isolation=vm"}, []string{"web-2"}},
		{[]string{"name=web"}, []string{"web-1", "web-2"}},
		{[]string{"name=*-2"}, []string{"web-2"}},
		{[]string{"name=we"}, []string{"web-1", "web-2"}},
		{[]string{"name=d?"}, []string{"db"}},
		{[]string{"template=base", "state=running"}, []string{"web-1"}},
	} {
		f, err := Parse(tc.filters, SandboxKeys)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.filters, err)
		}
		var got []string
		for i := range sbs {
			if f.Sandbox(&sbs[i]) {
				got = append(got, sbs[i].Name)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q matched %q, want %q", tc.filters, got, tc.want)
		}
	}
}

// The query the SDK sends reads back as the same filter.
func TestFromQuery(t *testing.T) {
	q, _ := url.ParseQuery("label=team%3Da&state=paused&state=running")
	f, err := FromQuery(q, SandboxKeys)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Sandbox(&api.Sandbox{State: "running", Labels: map[string]string{"team": "a"}}) || f.Sandbox(&api.Sandbox{State: "paused"}) {
		t.Error("label=team=a with state paused or running")
	}
	if _, err := FromQuery(url.Values{"progress": {"1"}}, SandboxKeys); err == nil {
		t.Error("an unknown parameter was taken")
	}
}

// FuzzFilter feeds a list request's query (an API caller's, untrusted)
// and a --filter flag's text to the parsers, and what they accept to the
// matcher: no panic, and nothing accepted beyond the bounds.
func FuzzFilter(f *testing.F) {
	f.Add("label=team%3Da&state=paused&name=w*", "label=team=a,state=running")
	f.Add("name=%5B", "name=[a-")
	f.Add("template=base&isolation=vm&label=k", "label=k=x,y")
	f.Fuzz(func(t *testing.T, query, flag string) {
		sb := &api.Sandbox{Name: "web-1", State: api.StateRunning, Template: "base", Isolation: "container", Labels: map[string]string{"team": "a", "k": ""}}
		if q, err := url.ParseQuery(query); err == nil {
			if flt, err := FromQuery(q, SandboxKeys); err == nil {
				for k, vs := range q {
					if len(vs) > MaxValues {
						t.Fatalf("%s given %d times, accepted", k, len(vs))
					}
					for _, v := range vs {
						if len(v) > MaxLabelBytes {
							t.Fatalf("a value of %d bytes accepted", len(v))
						}
					}
				}
				flt.Sandbox(sb)
			}
		}
		if flt, err := Parse(Split(flag, SandboxKeys), SandboxKeys); err == nil {
			flt.Sandbox(sb)
			flt.Name("web-1")
		}
	})
}
