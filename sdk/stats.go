package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nookhq/nook/api"
)

// SandboxStats reads what sandbox name uses now: CPU (measured over a
// second, so the call takes one), memory, disk, network and processes.
func (c *Client) SandboxStats(ctx context.Context, name string) (*api.SandboxStats, error) {
	var st api.SandboxStats
	if err := c.call(ctx, "GET", "/v1/sandboxes/"+esc(name)+"/stats", nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// AllStats reads what every sandbox the token may see uses now, as
// SandboxStats does for one.
func (c *Client) AllStats(ctx context.Context) ([]api.SandboxStats, error) {
	var st []api.SandboxStats
	if err := c.call(ctx, "GET", "/v1/stats", nil, &st); err != nil {
		return nil, err
	}
	return st, nil
}

// ErrStatsEnded is what StreamStats returns when the daemon ends the
// stream: the sandbox was destroyed, or the daemon stopped.
var ErrStatsEnded = errors.New("the stats stream ended")

// StreamStats calls on with a sample a second of sandbox name (a list of
// one), or of every sandbox the token may see if name is "", until ctx
// ends (it returns nil then), on returns an error (returned), or the
// daemon ends the stream (ErrStatsEnded).
func (c *Client) StreamStats(ctx context.Context, name string, on func([]api.SandboxStats) error) error {
	path := "/v1/stats?stream=true"
	if name != "" {
		path = "/v1/sandboxes/" + esc(name) + "/stats?stream=true"
	}
	resp, err := c.do(ctx, "GET", path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		var sample []api.SandboxStats
		if name != "" {
			var one api.SandboxStats
			err = json.Unmarshal(sc.Bytes(), &one)
			sample = []api.SandboxStats{one}
		} else {
			err = json.Unmarshal(sc.Bytes(), &sample)
		}
		if err != nil {
			return fmt.Errorf("bad stats sample: %w", err)
		}
		if err := on(sample); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %w", ErrStatsEnded, err)
	}
	return ErrStatsEnded
}
