package sdk

import (
	"bytes"
	"context"
	"io"

	"github.com/nookhq/nook/api"
)

// SetSecret stores a secret's value (new, or replacing one this token
// owns). Sandboxes bind it at create (api.CreateSandboxRequest.Secrets)
// and see only a placeholder.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) error {
	resp, err := c.send(ctx, "PUT", "/v1/secrets/"+esc(name), "application/octet-stream", bytes.NewReader(value))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// ListSecrets lists the secrets, never their values.
func (c *Client) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	var out api.SecretList
	return out.Secrets, c.call(ctx, "GET", "/v1/secrets", nil, &out)
}

// DeleteSecret removes a secret.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/secrets/"+esc(name), nil, nil)
}
