package core

import (
	"fmt"
	"math"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nookhq/nook/internal/errdefs"
)

// Limits on what a user may ask for.
const (
	MinTTL     = time.Minute
	MaxTTL     = 90 * 24 * time.Hour // extendable with `nook ttl`, so no hard lifetime cap
	DefaultTTL = time.Hour
	MinMemory  = 64 << 20
	MaxNameLen = 63
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ValidateName checks a sandbox name: it becomes the sandbox's hostname, so
// it must be a DNS label.
func ValidateName(name string) error {
	if name == "" {
		return errdefs.Invalid("sandbox name is empty")
	}
	if len(name) > MaxNameLen || !nameRE.MatchString(name) {
		return errdefs.Invalid("sandbox name %q is not valid: use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit", clip(name))
	}
	return nil
}

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateEnv checks environment variable names and values.
func ValidateEnv(env map[string]string) error {
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return errdefs.Invalid("environment variable name %q is not valid: use letters, digits and '_', not starting with a digit", clip(k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errdefs.Invalid("environment variable %s contains a NUL byte", k)
		}
	}
	return nil
}

// Bounds of a sandbox's labels.
const (
	MaxLabels          = 64
	MaxLabelKeyBytes   = 128
	MaxLabelValueBytes = 1024
)

// ValidateLabels checks a sandbox's labels: at most MaxLabels, keys
// non-empty UTF-8 text of at most MaxLabelKeyBytes, values UTF-8 text of
// at most MaxLabelValueBytes, neither with a NUL or other control
// character.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return errdefs.Invalid("%d labels: a sandbox has at most %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > MaxLabelKeyBytes || !labelText(k) {
			return errdefs.Invalid("label key %q is not valid: give 1 to %d bytes of text without control characters", clip(k), MaxLabelKeyBytes)
		}
		if len(v) > MaxLabelValueBytes || !labelText(v) {
			return errdefs.Invalid("label %s: its value is not valid: give at most %d bytes of text without control characters", clip(k), MaxLabelValueBytes)
		}
	}
	return nil
}

func labelText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// ParseEnvList turns ["K=V", ...] into a map, as --env flags give it.
func ParseEnvList(list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(list))
	for _, kv := range list {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, errdefs.Invalid("--env %q is not valid: write it as KEY=VALUE", clip(kv))
		}
		env[k] = v
	}
	return env, ValidateEnv(env)
}

// ParseSize parses a size such as "512M", "2G", "2GiB", "1.5g" or a plain
// number of bytes. Units are powers of 1024.
func ParseSize(s string) (int64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errdefs.Invalid("size is empty: write it like 512M or 2G")
	}
	num := strings.TrimRightFunc(in, func(r rune) bool { return r >= 'A' && r <= 'z' })
	unit := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(in[len(num):], "B"), "b"))
	unit = strings.TrimSuffix(unit, "I")
	var mult float64
	switch unit {
	case "":
		mult = 1
	case "K":
		mult = 1 << 10
	case "M":
		mult = 1 << 20
	case "G":
		mult = 1 << 30
	case "T":
		mult = 1 << 40
	default:
		return 0, errdefs.Invalid("size %q is not valid: write it like 512M or 2G (units K, M, G, T)", clip(s))
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) || num != strings.TrimSpace(num) {
		return 0, errdefs.Invalid("size %q is not valid: write it like 512M or 2G (units K, M, G, T)", clip(s))
	}
	v := f * mult
	if v >= math.MaxInt64/2 {
		return 0, errdefs.Invalid("size %q is too large", clip(s))
	}
	return int64(v), nil
}

// ParseDuration parses a duration such as "90m", "2h", "1h30m", "3d" or
// "2w" (d = 24h, w = 7d; Go duration units otherwise).
func ParseDuration(s string) (time.Duration, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errdefs.Invalid("duration is empty: write it like 90m, 2h, 3d or 2w")
	}
	var total time.Duration
	rest := in
	// Peel off leading "<n>w" and "<n>d" parts, then hand the rest to time.ParseDuration.
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9') {
			i++
		}
		if i == 0 || i == len(rest) || (rest[i] != 'd' && rest[i] != 'w') {
			break
		}
		n, err := strconv.ParseInt(rest[:i], 10, 64)
		if err != nil || n > 100000 {
			return 0, errdefs.Invalid("duration %q is too large", clip(s))
		}
		unit := 24 * time.Hour
		if rest[i] == 'w' {
			unit *= 7
		}
		total += time.Duration(n) * unit
		rest = rest[i+1:]
	}
	if rest != "" {
		d, err := time.ParseDuration(rest)
		if err != nil {
			return 0, errdefs.Invalid("duration %q is not valid: write it like 90m, 2h, 3d or 2w", clip(s))
		}
		if d < 0 {
			return 0, errdefs.Invalid("duration %q is negative", clip(s))
		}
		total += d
	}
	if total < 0 {
		return 0, errdefs.Invalid("duration %q is too large", clip(s))
	}
	return total, nil
}

// ValidateTTL parses a TTL and checks its range. Empty means DefaultTTL.
func ValidateTTL(s string) (time.Duration, error) {
	if s == "" {
		return DefaultTTL, nil
	}
	d, err := ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("ttl: %w", err)
	}
	if d < MinTTL || d > MaxTTL {
		return 0, errdefs.Invalid("ttl %q is out of range: use between 1m and 90d (extend it later with `nook ttl`)", clip(s))
	}
	return d, nil
}

// FormatBytes renders a size the way ParseSize reads it.
func FormatBytes(n int64) string {
	units := []string{"", "K", "M", "G", "T"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == math.Trunc(f) {
		return fmt.Sprintf("%d%s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

// clip shortens user input quoted back in an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// HostSize returns the host's CPU count and total memory in bytes.
func HostSize() (int, int64) {
	var si syscall.Sysinfo_t
	var mem int64
	if syscall.Sysinfo(&si) == nil {
		mem = int64(si.Totalram) * int64(si.Unit)
	}
	return runtime.NumCPU(), mem
}

// Idle pause and TTL expiry.
const (
	MinIdlePause = time.Minute
	MaxIdlePause = 30 * 24 * time.Hour
	// OnExpireDestroy, OnExpirePause and OnExpireStop are what a
	// sandbox's TTL does when it runs out.
	OnExpireDestroy = "destroy"
	OnExpirePause   = "pause"
	OnExpireStop    = "stop"
)

// ParseIdlePause parses how long a sandbox may be idle before it is
// paused: "0", "off" or "never" mean never (0); otherwise a duration
// between min and MaxIdlePause. min is MinIdlePause unless the daemon was
// told otherwise (tests).
func ParseIdlePause(s string, min time.Duration) (time.Duration, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "0", "off", "never":
		return 0, nil
	}
	d, err := ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("idle pause: %w (or off to never pause)", err)
	}
	if d < min || d > MaxIdlePause {
		return 0, errdefs.Invalid("idle pause %q is out of range: use between %s and 30d, or off to never pause", clip(s), FormatDuration(min))
	}
	return d, nil
}

// ValidateOnExpire checks what a TTL does when it runs out; empty means destroy.
func ValidateOnExpire(s string) (string, error) {
	switch s {
	case "", OnExpireDestroy:
		return OnExpireDestroy, nil
	case OnExpirePause, OnExpireStop:
		return s, nil
	}
	return "", errdefs.Invalid("on expire %q is not valid: use destroy, pause or stop", clip(s))
}

// FormatDuration renders a duration the way ParseDuration reads it, with
// days and without zero trailing units: "3d", "1d12h", "1h30m", "10m".
func FormatDuration(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	var b strings.Builder
	if days := d / (24 * time.Hour); days > 0 {
		fmt.Fprintf(&b, "%dd", days)
		d -= days * 24 * time.Hour
	}
	if d > 0 {
		s := d.String()
		// Drop zero trailing units: "1h30m0s" -> "1h30m", "2h0m0s" -> "2h".
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		b.WriteString(s)
	}
	return b.String()
}
