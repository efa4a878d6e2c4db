package sdk

import (
	"context"

	"github.com/nookhq/nook/api"
)

// sshKeysPath is a sandbox's keys, or ("") the token's own.
func sshKeysPath(sandbox string) string {
	if sandbox == "" {
		return "/v1/ssh-keys"
	}
	return "/v1/sandboxes/" + esc(sandbox) + "/ssh-keys"
}

// AddSSHKey registers an SSH public key (an authorized_keys line) that
// logs in to sandbox through the daemon's SSH endpoint; sandbox "": to
// every sandbox this client's token may run commands in.
func (c *Client) AddSSHKey(ctx context.Context, sandbox, publicKey string) (*api.SSHKey, error) {
	var out api.SSHKey
	return &out, c.call(ctx, "POST", sshKeysPath(sandbox), api.AddSSHKeyRequest{PublicKey: publicKey}, &out)
}

// SSHKeys lists a sandbox's SSH keys, or ("") the token's own.
func (c *Client) SSHKeys(ctx context.Context, sandbox string) ([]api.SSHKey, error) {
	var out []api.SSHKey
	return out, c.call(ctx, "GET", sshKeysPath(sandbox), nil, &out)
}

// RemoveSSHKey removes an SSH key by ID from a sandbox, or ("") the
// token's own.
func (c *Client) RemoveSSHKey(ctx context.Context, sandbox, id string) error {
	return c.call(ctx, "DELETE", sshKeysPath(sandbox)+"/"+esc(id), nil, nil)
}

// SSHCert has the daemon's SSH CA certify a public key for logging in to
// a sandbox (what `nook ssh` does with a key it makes for one login).
func (c *Client) SSHCert(ctx context.Context, name string, req api.SSHCertRequest) (*api.SSHCert, error) {
	var out api.SSHCert
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/ssh-cert", req, &out)
}
