package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/nookhq/nook/api"
)

// VolumeFiles are the files of a volume, read and written by the daemon
// without a sandbox (the same routes as a sandbox's files, under
// /v1/volumes/NAME/files). Paths are absolute in the volume.
type VolumeFiles struct {
	c    *Client
	name string
}

// Volume returns the files of volume name.
func (c *Client) Volume(name string) *VolumeFiles { return &VolumeFiles{c: c, name: name} }

func (v *VolumeFiles) path(op string, q url.Values) string {
	return "/v1/volumes/" + esc(v.name) + "/files/" + op + "?" + q.Encode()
}

// StatFile describes a path, not following a final symlink.
func (v *VolumeFiles) StatFile(ctx context.Context, path string) (*api.FileInfo, error) {
	var out api.FileInfo
	return &out, v.c.call(ctx, "GET", v.path("stat", url.Values{"path": {path}}), nil, &out)
}

// ListFiles lists a directory (recursive: its whole tree), or describes one file.
func (v *VolumeFiles) ListFiles(ctx context.Context, path string, opt ListOptions) (*api.FileList, error) {
	q := url.Values{"path": {path}}
	if opt.Recursive {
		q.Set("recursive", "true")
	}
	if opt.MaxEntries > 0 {
		q.Set("max_entries", strconv.Itoa(opt.MaxEntries))
	}
	var out api.FileList
	return &out, v.c.call(ctx, "GET", v.path("list", q), nil, &out)
}

// ReadFile opens a file for reading; the caller reads it to io.EOF and closes it.
func (v *VolumeFiles) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := v.c.do(ctx, "GET", v.path("content", url.Values{"path": {path}}), nil)
	if err != nil {
		return nil, err
	}
	return &streamBody{body: resp.Body, what: "read " + v.name + ":" + path}, nil
}

// WriteFile replaces a file with what r holds (parents: make missing directories).
func (v *VolumeFiles) WriteFile(ctx context.Context, path string, r io.Reader, parents bool) (*api.FileInfo, error) {
	q := url.Values{"path": {path}}
	if parents {
		q.Set("parents", "true")
	}
	return v.put(ctx, v.path("content", q), "application/octet-stream", r, "write "+path)
}

// DownloadArchive streams a tar of a file or tree; its top entry is the
// path's base name ("." for /).
func (v *VolumeFiles) DownloadArchive(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := v.c.do(ctx, "GET", v.path("archive", url.Values{"path": {path}}), nil)
	if err != nil {
		return nil, err
	}
	return &streamBody{body: resp.Body, what: "download " + v.name + ":" + path}, nil
}

// UploadArchive extracts a tar stream into a directory (made, with its
// parents, if parents). No entry lands outside the directory.
func (v *VolumeFiles) UploadArchive(ctx context.Context, dir string, r io.Reader, parents bool) (*api.FileInfo, error) {
	q := url.Values{"path": {dir}}
	if parents {
		q.Set("parents", "true")
	}
	return v.put(ctx, v.path("archive", q), "application/x-tar", r, "upload to "+dir)
}

func (v *VolumeFiles) put(ctx context.Context, p, contentType string, r io.Reader, what string) (*api.FileInfo, error) {
	resp, err := v.c.send(ctx, "PUT", p, contentType, bodyReader{r})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out api.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("volume %s: %s: decode response: %w", v.name, what, err)
	}
	return &out, nil
}
