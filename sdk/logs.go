package sdk

import (
	"context"
	"io"
	"net/url"
	"strconv"

	"github.com/nookhq/nook/api"
)

// LogsOptions chooses what SandboxLogs reads.
type LogsOptions struct {
	// Log is agent or console; "" is the one the sandbox's backend keeps
	// its init's and agent's output in (a container's agent log, a vm's
	// serial console). A backend without the other says why, as an error.
	Log string
	// Tail is how many of the last lines: 0 all (of the log's last MiB),
	// < 0 none (with Follow: only what is written from now on).
	Tail   int
	Follow bool // go on with what is written, until ctx ends or the sandbox is gone
}

// SandboxLogs streams a sandbox's log: its last opts.Tail lines, then,
// with Follow, what is added. It returns the
// log's name (agent or console) and its bytes, which the sandbox wrote:
// escape them before showing them on a terminal. Close the reader.
func (c *Client) SandboxLogs(ctx context.Context, name string, opts LogsOptions) (string, io.ReadCloser, error) {
	q := url.Values{}
	if opts.Log != "" {
		q.Set("log", opts.Log)
	}
	switch {
	case opts.Tail > 0:
		q.Set("tail", strconv.Itoa(opts.Tail))
	case opts.Tail < 0:
		q.Set("tail", "0")
	}
	if opts.Follow {
		q.Set("follow", "true")
	}
	p := "/v1/sandboxes/" + esc(name) + "/logs"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	resp, err := c.do(ctx, "GET", p, nil)
	if err != nil {
		return "", nil, err
	}
	return resp.Header.Get(api.LogHeader), resp.Body, nil
}
