package sdk

import (
	"context"

	"github.com/nookhq/nook/api"
)

// CreateSnapshot takes a snapshot of a running or paused sandbox (its
// disk, and its memory where the backend can); name may be empty (snap-N).
func (c *Client) CreateSnapshot(ctx context.Context, sandbox, name string) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(sandbox)+"/snapshots", api.CreateSnapshotRequest{Name: name}, &out)
}

// ListSnapshots returns a sandbox's snapshots, oldest first.
func (c *Client) ListSnapshots(ctx context.Context, sandbox string) ([]api.Snapshot, error) {
	var out []api.Snapshot
	return out, c.call(ctx, "GET", "/v1/sandboxes/"+esc(sandbox)+"/snapshots", nil, &out)
}

// DeleteSnapshot removes a snapshot (by name or ID).
func (c *Client) DeleteSnapshot(ctx context.Context, sandbox, snapshot string) error {
	return c.call(ctx, "DELETE", "/v1/sandboxes/"+esc(sandbox)+"/snapshots/"+esc(snapshot), nil, nil)
}

// Rollback puts a sandbox back to one of its snapshots.
func (c *Client) Rollback(ctx context.Context, sandbox, snapshot string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(sandbox)+"/rollback", api.RollbackRequest{Snapshot: snapshot}, &out)
}

// Fork makes new sandboxes from a sandbox: from one of its snapshots, or
// (req.Snapshot empty) from a snapshot taken now.
func (c *Client) Fork(ctx context.Context, sandbox string, req api.ForkRequest) ([]api.Sandbox, error) {
	var out api.ForkResponse
	if err := c.call(ctx, "POST", "/v1/sandboxes/"+esc(sandbox)+"/fork", req, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}
