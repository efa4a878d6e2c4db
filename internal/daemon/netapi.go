package daemon

import (
	"context"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/policy"
)

// errNoNetworking refuses network requests to a daemon without networking.
func errNoNetworking() error {
	return errdefs.Precondition("this nook daemon runs without sandbox networking (serve --network=false): sandboxes have loopback only")
}

// Networking reports whether sandboxes have networks (and policies).
func (m *Manager) Networking() bool { return m.net != nil }

// createPolicy validates a create request's network policy before anything
// is made.
func (m *Manager) createPolicy(req api.CreateSandboxRequest) (policy.Policy, error) {
	if m.net == nil {
		if req.Net != "" || len(req.Allow) > 0 || len(req.Deny) > 0 {
			return policy.Policy{}, errNoNetworking()
		}
		return policy.Policy{}, nil
	}
	return m.net.parsePolicy(req.Net, req.Allow, req.Deny)
}

// networkSandbox returns a sandbox whose network can be read or changed.
func (m *Manager) networkSandbox(ctx context.Context, name string) (*core.Sandbox, error) {
	if m.net == nil {
		return nil, errNoNetworking()
	}
	sb, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if sb.State != core.StateRunning && sb.State != core.StatePaused && sb.State != core.StateStopped {
		return nil, errdefs.Precondition("sandbox %s is %s: its network cannot change", name, sb.State)
	}
	return sb, nil
}

// Network returns a sandbox's network.
func (m *Manager) Network(ctx context.Context, name string) (*api.Network, error) {
	if m.net == nil {
		return nil, errNoNetworking()
	}
	sb, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	v := m.net.view(sb.ID)
	if v == nil {
		return nil, errdefs.Precondition("sandbox %s has no network", name)
	}
	return v, nil
}

// SetNetwork replaces a sandbox's whole policy. It takes effect at once:
// new connections and DNS queries see it, and connections it no longer
// allows are cut. Nothing changes if any rule is bad.
func (m *Manager) SetNetwork(ctx context.Context, name string, req api.SetNetworkRequest) (*api.Network, error) {
	if m.net == nil {
		return nil, errNoNetworking()
	}
	if err := core.ValidateName(name); err != nil {
		return nil, err
	}
	p, err := m.net.parsePolicy(req.Net, req.Allow, req.Deny)
	if err != nil {
		return nil, err
	}
	unlock := m.lockName(name)
	defer unlock()
	sb, err := m.networkSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := m.net.change(context.WithoutCancel(ctx), sb, p); err != nil {
		return nil, err
	}
	m.log.Info("sandbox network policy changed", "sandbox", name, "policy", p.String())
	return m.net.view(sb.ID), nil
}

// NetLog returns a sandbox's denied connections and refused DNS queries,
// oldest first.
func (m *Manager) NetLog(ctx context.Context, name string) (api.NetLog, error) {
	if m.net == nil {
		return api.NetLog{}, errNoNetworking()
	}
	sb, err := m.Get(ctx, name)
	if err != nil {
		return api.NetLog{}, err
	}
	m.net.flushLog(ctx)
	entries, err := m.store.NetLog(ctx, sb.ID, netLogKeep)
	if err != nil {
		return api.NetLog{}, err
	}
	out := api.NetLog{Entries: make([]api.NetLogEntry, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, api.NetLogEntry{Time: e.Time.UTC(), Kind: e.Kind, Destination: e.Destination,
			Reason: e.Reason, Detail: e.Detail, Suppressed: e.Suppressed})
	}
	return out, nil
}

func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return errdefs.Invalid("port %d is not valid: give a TCP port between 1 and 65535", port)
	}
	return nil
}

// Expose makes a sandbox's TCP port reachable from the host, and returns
// where.
func (m *Manager) Expose(ctx context.Context, name string, port int, public bool) (api.ExposedPort, error) {
	if err := checkPort(port); err != nil {
		return api.ExposedPort{}, err
	}
	if m.net == nil {
		return api.ExposedPort{}, errNoNetworking()
	}
	if err := core.ValidateName(name); err != nil {
		return api.ExposedPort{}, err
	}
	unlock := m.lockName(name)
	defer unlock()
	sb, err := m.networkSandbox(ctx, name)
	if err != nil {
		return api.ExposedPort{}, err
	}
	addr, err := m.net.expose(context.WithoutCancel(ctx), sb, uint16(port), public)
	if err != nil {
		return api.ExposedPort{}, err
	}
	return api.ExposedPort{Port: port, HostAddress: addr.String(), Public: public}, nil
}

// PreviewPort says whether port of the sandbox with this ID is exposed,
// and its preview URL's settings: whether it needs no token, and the
// nonce its tokens are signed with (new for each exposure).
func (m *Manager) PreviewPort(id string, port int) (exposed bool, public bool, nonce string) {
	if m.net == nil || port < 1 || port > 65535 {
		return false, false, ""
	}
	ok, pv := m.net.previewPort(id, uint16(port))
	return ok, pv.Public, pv.Nonce
}

// Unexpose closes an exposed port and the connections through it.
func (m *Manager) Unexpose(ctx context.Context, name string, port int) error {
	if err := checkPort(port); err != nil {
		return err
	}
	if m.net == nil {
		return errNoNetworking()
	}
	if err := core.ValidateName(name); err != nil {
		return err
	}
	unlock := m.lockName(name)
	defer unlock()
	sb, err := m.networkSandbox(ctx, name)
	if err != nil {
		return err
	}
	return m.net.unexpose(context.WithoutCancel(ctx), sb, uint16(port))
}
