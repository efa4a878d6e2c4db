package sdk

import (
	"context"
	"strconv"

	"github.com/nookhq/nook/api"
)

// Network returns a sandbox's network: its address and egress policy.
func (c *Client) Network(ctx context.Context, name string) (*api.Network, error) {
	var out api.Network
	return &out, c.call(ctx, "GET", "/v1/sandboxes/"+esc(name)+"/network", nil, &out)
}

// SetNetwork replaces a sandbox's whole egress policy; it takes effect at
// once, and connections it no longer allows are cut.
func (c *Client) SetNetwork(ctx context.Context, name string, req api.SetNetworkRequest) (*api.Network, error) {
	var out api.Network
	return &out, c.call(ctx, "PUT", "/v1/sandboxes/"+esc(name)+"/network", req, &out)
}

// NetLog returns what a sandbox was denied (connections and DNS queries),
// oldest first.
func (c *Client) NetLog(ctx context.Context, name string) (*api.NetLog, error) {
	var out api.NetLog
	return &out, c.call(ctx, "GET", "/v1/sandboxes/"+esc(name)+"/network/log", nil, &out)
}

// Expose makes a sandbox's TCP port reachable from the daemon's host and
// returns the host address.
func (c *Client) Expose(ctx context.Context, name string, port int) (*api.ExposedPort, error) {
	return c.ExposePort(ctx, name, api.ExposeRequest{Port: port})
}

// ExposePort exposes a port as Expose does, with the preview URL's access
// (req.Auth); the answer's URL is its preview URL when the daemon serves
// them.
func (c *Client) ExposePort(ctx context.Context, name string, req api.ExposeRequest) (*api.ExposedPort, error) {
	var out api.ExposedPort
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/expose", req, &out)
}

// Unexpose closes an exposed port.
func (c *Client) Unexpose(ctx context.Context, name string, port int) error {
	return c.call(ctx, "DELETE", "/v1/sandboxes/"+esc(name)+"/expose/"+strconv.Itoa(port), nil, nil)
}
