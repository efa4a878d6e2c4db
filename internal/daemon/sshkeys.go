package daemon

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// SSH public keys that may log in through nook's SSH endpoint
// (internal/sshd). A key is a sandbox's, or a token's: a key added
// without a sandbox logs in to every sandbox the token that added it may
// run commands in (an admin token's: all; a sandbox token's: its one),
// and only while that token is valid; revoking the token removes its
// keys. The host's socket adds keys good for every sandbox.

type tokenIDKey struct{}

// WithTokenID records the ID of the token a call came with (the API
// edge sets it; none: the host's socket).
func WithTokenID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, tokenIDKey{}, id)
}

func tokenIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(tokenIDKey{}).(string)
	return id
}

// maxSSHKeyLine bounds an authorized_keys line (a 16384-bit RSA key is
// about 2.8 KB).
const maxSSHKeyLine = 8 << 10

// ParseSSHKey reads one authorized_keys line: a public key and an
// optional comment, no options, no certificate, no weak key.
func ParseSSHKey(line string) (ssh.PublicKey, string, error) {
	line = strings.TrimSpace(line)
	if line == "" {
		return nil, "", errdefs.Invalid("the SSH public key is empty: give the contents of a .pub file, e.g. ~/.ssh/id_ed25519.pub")
	}
	if len(line) > maxSSHKeyLine {
		return nil, "", errdefs.Invalid("the SSH public key is longer than %d bytes", maxSSHKeyLine)
	}
	if strings.Contains(line, "PRIVATE KEY") {
		return nil, "", errdefs.Invalid("that is a private key: give the public one (the .pub file)")
	}
	pub, comment, opts, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, "", errdefs.Invalid("not an SSH public key (want one line like `ssh-ed25519 AAAA... comment`): %v", err)
	}
	if len(opts) > 0 {
		return nil, "", errdefs.Invalid("the SSH public key has authorized_keys options (%s): nook takes the key alone", strings.Join(opts, ","))
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, "", errdefs.Invalid("give one SSH public key at a time")
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		return nil, "", errdefs.Invalid("that is an SSH certificate: register the key itself (certificates come from `nook ssh`)")
	}
	if pub.Type() == "ssh-dss" {
		return nil, "", errdefs.Invalid("DSA keys are refused (OpenSSH dropped them): use ssh-keygen -t ed25519")
	}
	if ck, ok := pub.(ssh.CryptoPublicKey); ok {
		if k, ok := ck.CryptoPublicKey().(*rsa.PublicKey); ok && k.N.BitLen() < 2048 {
			return nil, "", errdefs.Invalid("the RSA key has %d bits: nook takes 2048 or more (or use ssh-keygen -t ed25519)", k.N.BitLen())
		}
	}
	if len(comment) > 200 {
		comment = comment[:200]
	}
	return pub, comment, nil
}

// AddSSHKey registers a public key for sandbox name ("": for every
// sandbox the calling token may run commands in). Adding a key again
// answers the key already there.
func (m *Manager) AddSSHKey(ctx context.Context, name, line string) (api.SSHKey, error) {
	pub, comment, err := ParseSSHKey(line)
	if err != nil {
		return api.SSHKey{}, err
	}
	sandboxID := ""
	if name != "" {
		sb, err := m.Get(ctx, name)
		if err != nil {
			return api.SSHKey{}, err
		}
		sandboxID = sb.ID
	}
	return m.addSSHKey(ctx, sandboxID, name, pub, comment)
}

func (m *Manager) addSSHKey(ctx context.Context, sandboxID, name string, pub ssh.PublicKey, comment string) (api.SSHKey, error) {
	fp := ssh.FingerprintSHA256(pub)
	owner := tokenIDFrom(ctx)
	have, err := m.store.SSHKeysByFingerprint(ctx, fp)
	if err != nil {
		return api.SSHKey{}, err
	}
	for _, k := range have {
		if k.SandboxID == sandboxID && k.Owner == owner {
			return sshKeyView(k, name), nil
		}
	}
	k := store.SSHKey{
		ID: "key-" + newID(), Fingerprint: fp, PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))),
		Comment: comment, SandboxID: sandboxID, Owner: owner, CreatedAt: time.Now(),
	}
	if err := m.store.InsertSSHKey(ctx, k); err != nil {
		return api.SSHKey{}, err
	}
	return sshKeyView(k, name), nil
}

// recordSSHKeys registers a create's keys for its sandbox; the keys were
// checked with ParseSSHKey before.
func (m *Manager) recordSSHKeys(ctx context.Context, sb *core.Sandbox, lines []string) error {
	for _, line := range lines {
		pub, comment, err := ParseSSHKey(line)
		if err != nil {
			return err
		}
		if _, err := m.addSSHKey(ctx, sb.ID, sb.Name, pub, comment); err != nil {
			return err
		}
	}
	return nil
}

// checkSSHKeys checks a create's keys before anything is made.
func checkSSHKeys(lines []string) error {
	if len(lines) > 64 {
		return errdefs.Invalid("at most 64 SSH keys per sandbox")
	}
	for i, line := range lines {
		if _, _, err := ParseSSHKey(line); err != nil {
			return fmt.Errorf("ssh_keys[%d]: %w", i, err)
		}
	}
	return nil
}

func sshKeyView(k store.SSHKey, sandbox string) api.SSHKey {
	owner := k.Owner
	if owner == "" {
		owner = "host"
	}
	return api.SSHKey{
		ID: k.ID, Fingerprint: k.Fingerprint, PublicKey: k.PublicKey, Comment: k.Comment,
		Sandbox: sandbox, Owner: owner, CreatedAt: k.CreatedAt.UTC(),
	}
}

// SSHKeys lists sandbox name's keys, or ("") the token-wide keys: a
// token sees its own, the host's socket every token's.
func (m *Manager) SSHKeys(ctx context.Context, name string) ([]api.SSHKey, error) {
	sandboxID := ""
	if name != "" {
		sb, err := m.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		sandboxID = sb.ID
	}
	keys, err := m.store.SSHKeysOf(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	out := []api.SSHKey{}
	owner := tokenIDFrom(ctx)
	for _, k := range keys {
		if name == "" && owner != "" && k.Owner != owner {
			continue
		}
		out = append(out, sshKeyView(k, name))
	}
	return out, nil
}

// RemoveSSHKey removes a key of sandbox name, or ("") a token-wide key
// (the token's own; the host's socket may remove any).
func (m *Manager) RemoveSSHKey(ctx context.Context, name, id string) error {
	sandboxID := ""
	if name != "" {
		sb, err := m.Get(ctx, name)
		if err != nil {
			return err
		}
		sandboxID = sb.ID
	}
	owner := tokenIDFrom(ctx)
	// A sandbox's keys are anyone's who may change the sandbox.
	return m.store.DeleteSSHKey(ctx, id, sandboxID, owner, owner == "" || name != "")
}

// SSHKeyAllows says whether a public key (by fingerprint) may log in to
// sb: a key of sb's own, or one without a sandbox, whose owner (the
// token that added it, while it is valid and reaches sb; or the host's
// socket) admits it. A sandbox's key added by a token stops working when
// that token does: a leaked token cannot leave a way in behind it.
func (m *Manager) SSHKeyAllows(ctx context.Context, sb *core.Sandbox, fingerprint string) (bool, error) {
	keys, err := m.store.SSHKeysByFingerprint(ctx, fingerprint)
	if err != nil {
		return false, err
	}
	for _, k := range keys {
		if k.SandboxID != "" && k.SandboxID != sb.ID {
			continue
		}
		ok, err := m.SSHTokenAllows(ctx, k.Owner, sb)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// SSHTokenAllows says whether the API token tokenID ("" the host's
// socket) may log in to sb over SSH: it exists, has not expired, and may
// run commands in sb (admin, or a sandbox token made for sb).
func (m *Manager) SSHTokenAllows(ctx context.Context, tokenID string, sb *core.Sandbox) (bool, error) {
	if tokenID == "" {
		return true, nil
	}
	t, err := m.store.TokenByID(ctx, tokenID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !t.ExpiresAt.IsZero() && !time.Now().Before(t.ExpiresAt) {
		return false, nil
	}
	scope, err := ParseScope(t.Scope)
	if err != nil {
		return false, nil
	}
	return scope.Kind == api.ScopeAdmin || (scope.Kind == ScopeSandbox && t.SandboxID == sb.ID), nil
}

// Used restarts a sandbox's idle clock: traffic of a session whose stream
// was opened Passive (an SSH session, a preview URL's connection).
func (m *Manager) Used(sandboxID string) { m.idle.touch(sandboxID) }

// Passive marks the agent streams a call opens as no use of the sandbox
// while they are open: only the traffic the caller reports with Used
// keeps the sandbox from its idle pause.
func Passive(ctx context.Context) context.Context { return agent.Quiet(ctx) }
