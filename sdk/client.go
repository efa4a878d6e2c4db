// Package sdk is nook's Go SDK: a small client for the daemon's REST API.
// The nook CLI uses it for everything. It depends only on the standard
// library and nook's api package.
//
// A daemon's TCP listener serves HTTPS, usually with a self-signed
// certificate: pin it with Options.TLSFingerprint (NOOK_TLS_FINGERPRINT)
// or give it as a CA with Options.TLSCAFile (NOOK_TLS_CA).
//
//	c, err := sdk.FromEnv()
//	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "task"})
//	exit, err := c.Exec(ctx, sb.Name, api.ExecRequest{Cmd: []string{"echo", "hi"}}, os.Stdout, os.Stderr)
package sdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/nookhq/nook/api"
)

// DefaultHost is where the daemon listens unless NOOK_HOST says otherwise.
const DefaultHost = "unix:///run/nook/nook.sock"

// Client talks to one nook daemon.
type Client struct {
	host  string
	base  string
	token string
	http  *http.Client
}

// Options configure a client beyond its host.
type Options struct {
	// Token is the bearer token the TCP listener needs.
	Token string
	// TLSFingerprint pins an https daemon's certificate:
	// "sha256:<64 hex digits>" (colons between bytes allowed), as
	// `nook serve` and `nook info` show it. The certificate must have
	// exactly this fingerprint; no CA is consulted.
	TLSFingerprint string
	// TLSCAFile is a PEM file of CA certificates to verify an https
	// daemon with (its self-signed certificate works too) instead of
	// the system's.
	TLSCAFile string
}

// FromEnv returns a client for NOOK_HOST (default unix:///run/nook/nook.sock)
// with NOOK_TOKEN, and for https NOOK_TLS_FINGERPRINT or NOOK_TLS_CA.
// NOOK_TOKEN is for TCP: on a unix socket (the host's own access) it is
// not sent, so a stale token in the environment cannot lock the host out
// of `nook token create`.
func FromEnv() (*Client, error) {
	host := os.Getenv("NOOK_HOST")
	if host == "" {
		host = DefaultHost
	}
	token := os.Getenv("NOOK_TOKEN")
	if strings.HasPrefix(host, "unix:") {
		token = ""
	}
	return NewWithOptions(host, Options{Token: token, TLSFingerprint: os.Getenv("NOOK_TLS_FINGERPRINT"), TLSCAFile: os.Getenv("NOOK_TLS_CA")})
}

// New returns a client for a daemon at host: "unix:///path/to/nook.sock"
// or "https://HOST:PORT" (verified with the system's CAs; see NewWithOptions).
func New(host, token string) (*Client, error) {
	return NewWithOptions(host, Options{Token: token})
}

// NewWithOptions returns a client for a daemon at host.
func NewWithOptions(host string, o Options) (*Client, error) {
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("NOOK_HOST %q is not valid: use unix:///run/nook/nook.sock or https://HOST:PORT", host)
	}
	c := &Client{host: host, token: o.Token}
	switch u.Scheme {
	case "unix":
		if u.Path == "" {
			return nil, fmt.Errorf("NOOK_HOST %q has no socket path: use unix:///run/nook/nook.sock", host)
		}
		path := u.Path
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		c.http = &http.Client{Transport: tr}
		c.base = "http://nook"
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("NOOK_HOST %q has no host: use https://HOST:PORT", host)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if u.Scheme == "https" {
			cfg, err := tlsConfig(o)
			if err != nil {
				return nil, err
			}
			tr.TLSClientConfig = cfg
		}
		c.http = &http.Client{Transport: tr}
		c.base = strings.TrimRight(u.String(), "/")
	default:
		return nil, fmt.Errorf("NOOK_HOST %q is not valid: use unix:///run/nook/nook.sock or https://HOST:PORT", host)
	}
	return c, nil
}

// Host is the daemon address this client uses.
func (c *Client) Host() string { return c.host }

// Error is an error the API returned.
type Error struct {
	Status  int    // HTTP status
	Code    string // stable code, e.g. "not_found"
	Message string
	// RequestID is the daemon's id of the request (its X-Request-Id
	// answer header), which its log lines of the request carry.
	RequestID string
}

func (e *Error) Error() string { return e.Message }

// IsNotFound reports whether err is an API not_found error.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == api.CodeNotFound
}

// IsLimit reports whether err is the daemon refusing a request that would
// go over a limit of its host (HTTP 429 limit_reached: nook serve
// --max-sandboxes or --max-memory). The message names the limit and the
// figures; retrying helps only once sandboxes are removed, stopped or
// paused.
func IsLimit(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == api.CodeLimitReached
}

// UnreachableError means the daemon could not be reached at all.
type UnreachableError struct {
	Host string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the nook daemon at %s (%v): is it running? Start it with `nook serve`, or point NOOK_HOST at it", e.Host, rootCause(e.Err))
}

func (e *UnreachableError) Unwrap() error { return e.Err }

func rootCause(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	if body == nil {
		return c.send(ctx, method, path, "", nil)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return c.send(ctx, method, path, "application/json", bytes.NewReader(b))
}

// send makes a request; a 4xx or 5xx answer becomes an *Error, a daemon
// that cannot be reached an *UnreachableError.
func (c *Client) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	setIdempotencyKey(ctx, req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var be *bodyError
		if errors.As(err, &be) {
			return nil, fmt.Errorf("reading the upload: %w", be.err)
		}
		if terr := tlsError(c.host, err); terr != nil {
			return nil, terr
		}
		return nil, &UnreachableError{Host: c.host, Err: err}
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var eb api.ErrorBody
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode == http.StatusBadRequest && bytes.Contains(b, []byte("HTTP request to an HTTPS server")) {
			return nil, &Error{Status: resp.StatusCode, Code: api.CodeInvalidArgument, Message: fmt.Sprintf("the nook daemon at %s serves HTTPS: use NOOK_HOST=https://%s", c.host, strings.TrimPrefix(c.host, "http://"))}
		}
		if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
			return nil, &Error{Status: resp.StatusCode, Code: api.CodeInternal, Message: fmt.Sprintf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(b)), RequestID: resp.Header.Get("X-Request-Id")}
		}
		return nil, &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, RequestID: resp.Header.Get("X-Request-Id")}
	}
	return resp, nil
}

func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", method, path, err)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// Info describes the daemon's host and backends.
func (c *Client) Info(ctx context.Context) (*api.Info, error) {
	var out api.Info
	return &out, c.call(ctx, "GET", "/v1/info", nil, &out)
}

// CreateSandbox creates a sandbox and returns it running.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes", req, &out)
}

// ListSandboxes lists the sandboxes that match every filter, each
// KEY=VALUE as `nook ls --filter` takes them: "label=team=a" (label
// team is a), "label=team" (has label team), "state=paused",
// "template=T", "isolation=vm", "name=GLOB" (a value without a wildcard
// is a prefix). A key repeated is alternatives, except label; no
// filters lists every sandbox. An unknown key is an error (400).
func (c *Client) ListSandboxes(ctx context.Context, filters ...string) ([]api.Sandbox, error) {
	p := "/v1/sandboxes"
	if len(filters) > 0 {
		q := url.Values{}
		for _, f := range filters {
			k, v, _ := strings.Cut(f, "=")
			q.Add(k, v)
		}
		p += "?" + q.Encode()
	}
	var out []api.Sandbox
	return out, c.call(ctx, "GET", p, nil, &out)
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "GET", "/v1/sandboxes/"+esc(name), nil, &out)
}

// DeleteSandbox destroys a sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/sandboxes/"+esc(name), nil, nil)
}

// PauseSandbox stops a sandbox's processes, keeping them; any call that
// needs it running (exec, files) resumes it.
func (c *Client) PauseSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/pause", nil, &out)
}

// ResumeSandbox continues a paused sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/resume", nil, &out)
}

// StopSandbox stops a running or paused sandbox: its processes end and
// its memory is freed; its disk is kept.
func (c *Client) StopSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/stop", nil, &out)
}

// StartSandbox starts a stopped sandbox again (a vm boots from its disk).
func (c *Client) StartSandbox(ctx context.Context, name string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/start", nil, &out)
}

// SetTTL sets a sandbox's remaining lifetime, e.g. "2h".
func (c *Client) SetTTL(ctx context.Context, name, ttl string) (*api.Sandbox, error) {
	var out api.Sandbox
	return &out, c.call(ctx, "PUT", "/v1/sandboxes/"+esc(name)+"/ttl", api.SetTTLRequest{TTL: ttl}, &out)
}

// Exec runs a command in a sandbox, streaming its output to stdout and
// stderr as it comes, and returns its exit status. Canceling ctx kills the command.
func (c *Client) Exec(ctx context.Context, name string, req api.ExecRequest, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	resp, err := c.do(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/exec", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readStream(ctx, "exec in "+name, resp.Body, stdout, stderr)
}

// ListTemplates lists built templates and the ones nook can build.
func (c *Client) ListTemplates(ctx context.Context) (*api.TemplateList, error) {
	var out api.TemplateList
	return &out, c.call(ctx, "GET", "/v1/templates", nil, &out)
}

// BuildTemplate builds a template, copying the build's progress to progress.
func (c *Client) BuildTemplate(ctx context.Context, name string, progress io.Writer) (string, error) {
	resp, err := c.do(ctx, "POST", "/v1/templates/"+esc(name)+"/build", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var last string
	buf := make([]byte, 4096)
	var line bytes.Buffer
	for {
		n, rerr := resp.Body.Read(buf)
		for _, b := range buf[:n] {
			line.WriteByte(b)
			if b == '\n' {
				last = strings.TrimSpace(line.String())
				if !strings.HasPrefix(last, "ok ") && !strings.HasPrefix(last, "error: ") && progress != nil {
					progress.Write(line.Bytes())
				}
				line.Reset()
			}
		}
		if rerr != nil {
			break
		}
	}
	if id, ok := strings.CutPrefix(last, "ok "); ok {
		return id, nil
	}
	if msg, ok := strings.CutPrefix(last, "error: "); ok {
		return "", &Error{Status: http.StatusOK, Code: api.CodeInternal, Message: msg}
	}
	return "", fmt.Errorf("template build of %s: the stream ended without a result", name)
}

// BuildTemplateFrom builds a template from one of nook's recipes (no
// From) or from an image (req.From: a registry reference, oci:DIR or
// docker-archive:FILE on the daemon's host), calling on with each event
// of the build as it comes (progress lines, layers pulled, how far those
// on their way are; on may be nil), and returns the template built.
func (c *Client) BuildTemplateFrom(ctx context.Context, req api.BuildTemplateRequest, on func(api.BuildEvent)) (*api.Template, error) {
	resp, err := c.do(ctx, "POST", "/v1/templates", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readBuildEvents(req.Name, resp.Body, on)
}

// readBuildEvents reads a template build's NDJSON stream to its result.
func readBuildEvents(name string, body io.Reader, on func(api.BuildEvent)) (*api.Template, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("template build of %s: a line of the stream is not an event: %w", name, err)
		}
		switch {
		case ev.Error != nil:
			return nil, &Error{Status: http.StatusOK, Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.Template != nil:
			return ev.Template, nil
		case on != nil:
			on(ev)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("template build of %s: %w", name, err)
	}
	return nil, fmt.Errorf("template build of %s: the stream ended without a result", name)
}

// BuildTemplateDockerfile builds template name from a Dockerfile in the
// build context contextTar (a tar stream of the context directory, the
// Dockerfile in it), calling on with each event of the build as it comes
// (may be nil), and returns the template built.
func (c *Client) BuildTemplateDockerfile(ctx context.Context, name string, req api.DockerfileBuild, contextTar io.Reader, on func(api.BuildEvent)) (*api.Template, error) {
	q := url.Values{}
	for k, v := range map[string]string{"dockerfile": req.Dockerfile, "target": req.Target, "start": req.Start, "ready": req.Ready} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for k, v := range req.BuildArgs {
		q.Add("build_arg", k+"="+v)
	}
	for _, a := range req.Allow {
		q.Add("allow", a)
	}
	resp, err := c.send(ctx, "POST", "/v1/templates/"+esc(name)+"/dockerfile?"+q.Encode(), "application/x-tar", contextTar)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readBuildEvents(name, resp.Body, on)
}

// DeleteTemplate removes a template no sandbox uses.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", "/v1/templates/"+esc(name), nil, nil)
}

// CreateVolume makes a volume (size such as "10G"; "" for the default).
func (c *Client) CreateVolume(ctx context.Context, name, size string) (*api.Volume, error) {
	var out api.Volume
	return &out, c.call(ctx, "POST", "/v1/volumes", api.CreateVolumeRequest{Name: name, Size: size}, &out)
}

// ListVolumes lists the volumes, each with the sandboxes that mount it.
func (c *Client) ListVolumes(ctx context.Context) ([]api.Volume, error) {
	var out api.VolumeList
	return out.Volumes, c.call(ctx, "GET", "/v1/volumes", nil, &out)
}

// GetVolume returns a volume and the sandboxes that mount it.
func (c *Client) GetVolume(ctx context.Context, name string) (*api.Volume, error) {
	var out api.Volume
	return &out, c.call(ctx, "GET", "/v1/volumes/"+esc(name), nil, &out)
}

// DeleteVolume removes a volume and its files; one a sandbox mounts is
// refused unless force.
func (c *Client) DeleteVolume(ctx context.Context, name string, force bool) error {
	p := "/v1/volumes/" + esc(name)
	if force {
		p += "?force=true"
	}
	return c.call(ctx, "DELETE", p, nil, nil)
}

// CreateToken creates an API token; its Secret is shown only here. Only
// the host (the unix socket without a token) may.
func (c *Client) CreateToken(ctx context.Context, req api.CreateTokenRequest) (*api.Token, error) {
	var out api.Token
	return &out, c.call(ctx, "POST", "/v1/tokens", req, &out)
}

// ListTokens lists API tokens (without secrets).
func (c *Client) ListTokens(ctx context.Context) ([]api.Token, error) {
	var out []api.Token
	return out, c.call(ctx, "GET", "/v1/tokens", nil, &out)
}

// DeleteToken revokes a token.
func (c *Client) DeleteToken(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", "/v1/tokens/"+esc(id), nil, nil)
}
