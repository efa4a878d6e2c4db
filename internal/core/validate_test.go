package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "task-1", "0x", strings.Repeat("a", 63)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a-", "A", "a_b", "a.b", "a b", strings.Repeat("a", 64), "é", "../x"} {
		err := ValidateName(bad)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: want invalid argument, got %v", bad, err)
		}
	}
}

func TestParseSize(t *testing.T) {
	cases := map[string]int64{"0": 0, "512": 512, "1K": 1024, "512M": 512 << 20, "2G": 2 << 30, "2GiB": 2 << 30, "2gb": 2 << 30, "1.5G": 3 << 29, "1T": 1 << 40}
	for in, want := range cases {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "G", "2X", "-1G", "1e400", "NaN", "2 G", "1.2.3M", "99999999T"} {
		if _, err := ParseSize(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseSize(%q): want invalid argument, got %v", bad, err)
		}
	}
}

func TestParseDuration(t *testing.T) {
	cases := map[string]time.Duration{"90m": 90 * time.Minute, "2h": 2 * time.Hour, "1h30m": 90 * time.Minute, "3d": 72 * time.Hour, "2w": 14 * 24 * time.Hour, "1d12h": 36 * time.Hour}
	for in, want := range cases {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "abc", "-1h", "5", "d", "1x", "99999999999w"} {
		if _, err := ParseDuration(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseDuration(%q): want invalid argument, got %v", bad, err)
		}
	}
}

func TestValidateTTL(t *testing.T) {
	if d, err := ValidateTTL(""); err != nil || d != DefaultTTL {
		t.Fatalf("default: %v %v", d, err)
	}
	for _, bad := range []string{"30s", "91d", "100w"} {
		if _, err := ValidateTTL(bad); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("ValidateTTL(%q): %v", bad, err)
		}
	}
}

func TestParseEnvList(t *testing.T) {
	env, err := ParseEnvList([]string{"A=1", "B=x=y", "C="})
	if err != nil || env["A"] != "1" || env["B"] != "x=y" || env["C"] != "" {
		t.Fatalf("%v %v", env, err)
	}
	for _, bad := range []string{"NOEQUALS", "1A=x", "A-B=x", "=x"} {
		if _, err := ParseEnvList([]string{bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestTransitions(t *testing.T) {
	if err := CheckTransition(StateCreating, StateRunning); err != nil {
		t.Fatal(err)
	}
	if err := CheckTransition(StateDestroying, StateRunning); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("destroying -> running allowed: %v", err)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"2G", "1.5g", "512", "-1", "1e9K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"90m", "3d", "2w1d5h", "-5m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err == nil && d < 0 {
			t.Fatalf("ParseDuration(%q) = %v", s, d)
		}
	})
}

func TestParseIdlePause(t *testing.T) {
	for in, want := range map[string]time.Duration{"off": 0, "0": 0, "never": 0, "10m": 10 * time.Minute, "1m": time.Minute, "30d": 30 * 24 * time.Hour, "1h30m": 90 * time.Minute} {
		if got, err := ParseIdlePause(in, MinIdlePause); err != nil || got != want {
			t.Errorf("ParseIdlePause(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "59s", "31d", "soon", "-5m", "1y"} {
		if _, err := ParseIdlePause(in, MinIdlePause); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseIdlePause(%q): %v", in, err)
		}
	}
	if got, err := ParseIdlePause("2s", time.Second); err != nil || got != 2*time.Second {
		t.Errorf("a lowered minimum: %v %v", got, err)
	}
}

func TestValidateOnExpire(t *testing.T) {
	for in, want := range map[string]string{"": OnExpireDestroy, "destroy": OnExpireDestroy, "pause": OnExpirePause} {
		if got, err := ValidateOnExpire(in); err != nil || got != want {
			t.Errorf("ValidateOnExpire(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ValidateOnExpire("Pause"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Pause: %v", err)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "0", 2 * time.Second: "2s", 10 * time.Minute: "10m", 90 * time.Minute: "1h30m",
		2 * time.Hour: "2h", 24 * time.Hour: "1d", 36 * time.Hour: "1d12h", 30 * 24 * time.Hour: "30d", 90 * time.Second: "1m30s"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if d > 0 {
			if back, err := ParseDuration(FormatDuration(d)); err != nil || back != d {
				t.Errorf("ParseDuration(FormatDuration(%v)) = %v, %v", d, back, err)
			}
		}
	}
}

func TestValidateLabels(t *testing.T) {
	long := strings.Repeat("k", MaxLabelKeyBytes+1)
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[fmt.Sprint(i)] = ""
	}
	for _, bad := range []map[string]string{{"": "v"}, {long: "v"}, {"k": strings.Repeat("v", MaxLabelValueBytes+1)}, {"a\nb": "v"}, {"k": "\x00"}, {"k": "\xff"}, many} {
		if err := ValidateLabels(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("labels %q: %v", bad, err)
		}
	}
	if err := ValidateLabels(map[string]string{"user id": "42", "ünï": "a=b c", "empty": ""}); err != nil {
		t.Error(err)
	}
}
