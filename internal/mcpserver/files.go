package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// The file tools use the API's file operations; search_files runs grep
// with the pattern and path as arguments, never through a shell, so they
// cannot inject commands.

func addFileTools(s *mcp.Server, t *tools) {
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a text file from a sandbox. Returns its content (up to 256 KiB from offset; " +
		"for bigger files read in parts with offset, or search_files). Use an absolute path."}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write a text file in a sandbox, creating parent directories, replacing any file at that path. " +
		"Use it to create source files, configs and scripts. Returns the number of bytes written."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "list_files", Description: "List a directory in a sandbox: each entry's path, type (file, dir, symlink) and size in bytes. " +
		"With recursive, the whole tree below it. At most 1000 entries are returned."}, t.listFiles)
	mcp.AddTool(s, &mcp.Tool{Name: "search_files", Description: "Search file contents under a directory in a sandbox for a regular expression (grep -E), " +
		"returning matching lines as path:line:text (at most 200 matches). Use it to find where something is defined or used."}, t.searchFiles)
}

const (
	readLimit = 256 << 10
	listLimit = 1000
)

func checkPath(p string) error {
	if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("path %q must be absolute, like /root/project/main.py", p)
	}
	return nil
}

// run runs argv in the sandbox and returns stdout, or an error carrying stderr.
func (t *tools) run(ctx context.Context, sandbox string, argv []string) (string, int, error) {
	var out, errb limitedBuffer
	st, err := t.c.Exec(ctx, sandbox, api.ExecRequest{Cmd: argv, Timeout: "60s"}, &out, &errb)
	if err != nil {
		return "", 0, err
	}
	if st.ExitCode != 0 && strings.TrimSpace(errb.String()) != "" {
		return out.String(), st.ExitCode, errors.New(strings.TrimSpace(errb.String()))
	}
	return out.String(), st.ExitCode, nil
}

// ReadFileInput is read_file's input.
type ReadFileInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path    string `json:"path" jsonschema:"absolute path of the file"`
	Offset  int64  `json:"offset,omitempty" jsonschema:"byte offset to start reading at; default 0"`
}

// ReadFileOutput is read_file's output.
type ReadFileOutput struct {
	Content   string `json:"content"`
	Size      int64  `json:"size"`
	Truncated bool   `json:"truncated,omitempty"`
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, any, error) {
	if err := checkPath(in.Path); err != nil {
		return fail(err)
	}
	if in.Offset < 0 {
		return fail(errors.New("offset must be 0 or more"))
	}
	fi, err := t.c.StatFile(ctx, in.Sandbox, in.Path)
	if err != nil {
		return fail(err)
	}
	if fi.Type != "file" {
		return fail(fmt.Errorf("%s is a %s, not a file: use list_files for directories", in.Path, fi.Type))
	}
	r, err := t.c.ReadFile(ctx, in.Sandbox, in.Path, &sdk.ReadOptions{Offset: in.Offset, Length: readLimit})
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, readLimit))
	if err != nil {
		return fail(err)
	}
	return nil, ReadFileOutput{Content: string(b), Size: fi.Size, Truncated: in.Offset+int64(len(b)) < fi.Size}, nil
}

// WriteFileInput is write_file's input.
type WriteFileInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path    string `json:"path" jsonschema:"absolute path of the file"`
	Content string `json:"content" jsonschema:"the file's full new content"`
}

// WriteFileOutput is write_file's output.
type WriteFileOutput struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, any, error) {
	if err := checkPath(in.Path); err != nil {
		return fail(err)
	}
	fi, err := t.c.WriteFile(ctx, in.Sandbox, in.Path, strings.NewReader(in.Content), &sdk.WriteOptions{Parents: true})
	if err != nil {
		return fail(err)
	}
	return nil, WriteFileOutput{Path: fi.Path, Bytes: fi.Size}, nil
}

// ListFilesInput is list_files' input.
type ListFilesInput struct {
	Sandbox   string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path      string `json:"path" jsonschema:"absolute path of a directory"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"list the whole tree below path, not just its entries"`
}

// ListFilesOutput is list_files' output.
type ListFilesOutput struct {
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated,omitempty"`
}

// FileEntry is one entry of list_files.
type FileEntry struct {
	Path string `json:"path"`
	Type string `json:"type"` // file, dir, symlink or other
	Size int64  `json:"size"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, any, error) {
	if err := checkPath(in.Path); err != nil {
		return fail(err)
	}
	l, err := t.c.ListFiles(ctx, in.Sandbox, in.Path, sdk.ListOptions{Recursive: in.Recursive, MaxEntries: listLimit})
	if err != nil {
		return fail(err)
	}
	res := ListFilesOutput{Entries: make([]FileEntry, 0, len(l.Entries)), Truncated: l.Truncated}
	for _, e := range l.Entries {
		res.Entries = append(res.Entries, FileEntry{Path: e.Path, Type: e.Type, Size: e.Size})
	}
	return nil, res, nil
}

// SearchFilesInput is search_files' input.
type SearchFilesInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Path    string `json:"path" jsonschema:"absolute path of the directory (or file) to search"`
	Pattern string `json:"pattern" jsonschema:"extended regular expression, as grep -E takes it"`
	Glob    string `json:"glob,omitempty" jsonschema:"only search files whose name matches this glob, e.g. *.py"`
}

// SearchFilesOutput is search_files' output.
type SearchFilesOutput struct {
	Matches   []string `json:"matches"`
	Truncated bool     `json:"truncated,omitempty"`
}

func (t *tools) searchFiles(ctx context.Context, _ *mcp.CallToolRequest, in SearchFilesInput) (*mcp.CallToolResult, any, error) {
	if err := checkPath(in.Path); err != nil {
		return fail(err)
	}
	if in.Pattern == "" {
		return fail(errors.New("pattern is empty"))
	}
	argv := []string{"grep", "-rnIE", "--max-count=200"}
	if in.Glob != "" {
		argv = append(argv, "--include="+in.Glob)
	}
	argv = append(argv, "-e", in.Pattern, "--", in.Path)
	out, code, err := t.run(ctx, in.Sandbox, argv)
	if err != nil && code != 1 {
		return fail(err)
	}
	res := SearchFilesOutput{Matches: []string{}}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		if len(res.Matches) == 200 {
			res.Truncated = true
			break
		}
		res.Matches = append(res.Matches, line)
	}
	return nil, res, nil
}
