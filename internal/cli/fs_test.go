package cli

import (
	"errors"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
)

func TestSplitRemote(t *testing.T) {
	for arg, want := range map[string]*remotePath{
		"box:/root/f": {"box", "/root/f"},
		"box:rel":     {"box", "rel"},
		"box:":        {"box", ""},
		"./a:b":       nil,
		"/tmp/a:b":    nil,
		":/x":         nil,
		"plain":       nil,
		"-":           nil,
	} {
		got, ok := splitRemote(arg)
		if (want == nil) == ok || want != nil && got != *want {
			t.Errorf("splitRemote(%q) = %+v %v", arg, got, ok)
		}
	}
	var ue *usageError
	if _, err := parseRemote("box:rel"); !errors.As(err, &ue) {
		t.Errorf("a relative path is a usage error: %v", err)
	}
	if _, err := parseRemote("nocolon"); !errors.As(err, &ue) {
		t.Errorf("a local path is a usage error: %v", err)
	}
}

func TestSymbolicMode(t *testing.T) {
	for _, tc := range []struct {
		typ, mode, want string
	}{
		{api.FileTypeFile, "0644", "-rw-r--r--"},
		{api.FileTypeDir, "0755", "drwxr-xr-x"},
		{api.FileTypeSymlink, "0777", "lrwxrwxrwx"},
		{api.FileTypeFile, "4755", "-rwsr-xr-x"},
		{api.FileTypeFile, "2640", "-rw-r-S---"},
		{api.FileTypeDir, "1777", "drwxrwxrwt"},
		{api.FileTypeOther, "0600", "?rw-------"},
	} {
		if got := symbolicMode(&api.FileInfo{Type: tc.typ, Mode: tc.mode, ModTime: time.Now()}); got != tc.want {
			t.Errorf("%s %s: %s, want %s", tc.typ, tc.mode, got, tc.want)
		}
	}
}
