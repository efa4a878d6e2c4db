package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

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

// CreateSandboxProgress creates a sandbox as CreateSandbox does, calling
// progress with each line of what the create does on the way (a template
// built, a repository cloned; progress may be nil).
func (c *Client) CreateSandboxProgress(ctx context.Context, req api.CreateSandboxRequest, progress func(line string)) (*api.Sandbox, error) {
	resp, err := c.do(ctx, "POST", "/v1/sandboxes?progress=ndjson", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev api.CreateEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("create: a line of the stream is not an event: %w", err)
		}
		switch {
		case ev.Error != nil:
			return nil, &Error{Status: http.StatusOK, Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.Sandbox != nil:
			return ev.Sandbox, nil
		case progress != nil && ev.Progress != "":
			progress(ev.Progress)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("create: the stream: %w", err)
	}
	return nil, errors.New("create: the stream ended without a result")
}
