package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/egress"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/secrets"
	"github.com/nookhq/nook/internal/store"
)

// maxSecret bounds a secret's value.
const maxSecret = 64 << 10

// secretStore keeps secrets sealed in the database (the key in
// DATA/secrets) and each sandbox's bindings; it hands a sandbox's egress
// proxy the interceptor that puts the values into requests to the bound
// hosts. Values are opened on first use and kept in memory only.
type secretStore struct {
	store *store.Store
	box   *secrets.Box
	log   *slog.Logger
	// refused records an intercepted request refused (the sandbox's
	// network log).
	refused func(id string, r secrets.Refusal)

	mu     sync.Mutex
	values map[string]secretValue // opened, by name
	// gen counts the changes of secrets and of sandboxes' bindings: a
	// read that began before a change does not fill the caches after it
	// (it is read again next time).
	gen uint64
	// sandboxes are the interceptors of sandboxes with bindings, by ID
	// (a nil entry: the sandbox has none), made on first use.
	sandboxes map[string]*secrets.Sandbox
}

func openSecrets(cfg Config, st *store.Store) (*secretStore, error) {
	box, err := secrets.OpenBox(filepath.Join(cfg.DataDir, "secrets"))
	if err != nil {
		return nil, err
	}
	return &secretStore{store: st, box: box, log: cfg.Log, values: map[string]secretValue{}, sandboxes: map[string]*secrets.Sandbox{}}, nil
}

func sealedAs(name string) string { return "secret:" + name }

// mayUse reports whether the caller may bind, replace or remove a
// secret: its owner, or the host.
func mayUse(ctx context.Context, sec store.Secret) error {
	if c := creatorFrom(ctx); c != "host" && c != sec.Owner {
		return errdefs.Denied("secret %s belongs to token %q: only it (or the host's socket) may use, replace or remove it", sec.Name, sec.Owner)
	}
	return nil
}

// SetSecret stores a secret's value (new, or replacing its owner's).
func (m *Manager) SetSecret(ctx context.Context, name string, value []byte) error {
	s := m.secrets
	if err := secrets.CheckName(name); err != nil {
		return err
	}
	if len(value) == 0 || len(value) > maxSecret {
		return errdefs.Invalid("secret %s: the value must be 1 byte to 64 KiB", name)
	}
	if strings.ContainsAny(string(value), "\r\n\x00") {
		return errdefs.Invalid("secret %s: the value holds a line break or NUL (it goes into HTTP headers): strip the trailing newline", name)
	}
	now := time.Now()
	caller := creatorFrom(ctx)
	rec := store.Secret{Name: name, ID: newID(), Owner: caller, Sealed: s.box.Seal(sealedAs(name), value), CreatedAt: now, UpdatedAt: now}
	ok, err := s.store.PutSecret(ctx, rec, caller == "host")
	if err != nil {
		return err
	}
	if !ok {
		return errdefs.Denied("secret %s belongs to another token: only it (or the host's socket) may replace it", name)
	}
	s.mu.Lock()
	s.changed(name) // read again, with its ID
	s.mu.Unlock()
	m.log.Info("secret set", "secret", name, "by", caller) // never the value
	return nil
}

// ListSecrets lists the secrets, never their values.
func (m *Manager) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	list, err := m.secrets.store.ListSecrets(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Secret{}
	for _, s := range list {
		out = append(out, api.Secret{Name: s.Name, Owner: s.Owner, CreatedAt: s.CreatedAt.UTC(), UpdatedAt: s.UpdatedAt.UTC()})
	}
	return out, nil
}

// DeleteSecret removes a secret: requests that would carry it are
// refused from then on.
func (m *Manager) DeleteSecret(ctx context.Context, name string) error {
	s := m.secrets
	caller := creatorFrom(ctx)
	if err := s.store.DeleteSecret(ctx, name, caller, caller == "host"); err != nil {
		return err
	}
	s.mu.Lock()
	s.changed(name)
	s.mu.Unlock()
	m.log.Info("secret removed", "secret", name, "by", caller)
	return nil
}

// changed drops what is cached under key (a secret's name, or
// "sandbox:" and a sandbox's ID) and counts the change. The caller
// holds mu.
func (s *secretStore) changed(key string) {
	s.gen++
	if id, ok := strings.CutPrefix(key, "sandbox:"); ok {
		delete(s.sandboxes, id)
	} else {
		delete(s.values, key)
	}
}

// value returns a binding's secret's value: an error when the secret
// is gone, or was removed and made again (by anyone: a binding never
// follows a name to another secret).
func (s *secretStore) value(b secrets.Bound) ([]byte, error) {
	s.mu.Lock()
	v, ok := s.values[b.Secret]
	gen := s.gen
	s.mu.Unlock()
	if !ok {
		sec, err := s.store.GetSecret(context.Background(), b.Secret)
		if err != nil {
			return nil, err
		}
		plain, err := s.box.Open(sealedAs(b.Secret), sec.Sealed)
		if err != nil {
			return nil, err
		}
		v = secretValue{id: sec.ID, value: plain}
		s.mu.Lock()
		if s.gen == gen { // else something changed meanwhile: not cached
			s.values[b.Secret] = v
		}
		s.mu.Unlock()
	}
	if v.id != b.SecretID {
		return nil, errdefs.NotFound("secret %s was removed and made again: the binding is gone", b.Secret)
	}
	return v.value, nil
}

// secretValue is an opened secret and its ID.
type secretValue struct {
	id    string
	value []byte
}

// bind parses a create's secret bindings and checks that the caller may
// use each secret; each gets a new placeholder, in env under the
// secret's name, and the CA variables name the bundle.
func (s *secretStore) bind(ctx context.Context, specs []string, env map[string]string) ([]secrets.Bound, error) {
	var out []secrets.Bound
	for _, spec := range specs {
		b, err := secrets.ParseBinding(spec)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(o secrets.Bound) bool { return o.Secret == b.Secret }) {
			return nil, errdefs.Invalid("secret %s is bound twice: give one binding all its hosts (NAME@HOST1,HOST2)", b.Secret)
		}
		if _, ok := env[b.Secret]; ok {
			return nil, errdefs.Invalid("secret %s: --env sets %s too (the variable holds the secret's placeholder)", b.Secret, b.Secret)
		}
		sec, err := s.store.GetSecret(ctx, b.Secret)
		if err != nil {
			return nil, err
		}
		if err := mayUse(ctx, sec); err != nil {
			return nil, err
		}
		out = append(out, secrets.Bound{Binding: b, Placeholder: secrets.NewPlaceholder(), SecretID: sec.ID})
	}
	setSecretEnv(env, out)
	return out, nil
}

// setSecretEnv puts each binding's placeholder, and the CA bundle's
// path, in env.
func setSecretEnv(env map[string]string, bound []secrets.Bound) {
	for _, b := range bound {
		if !b.Retired {
			env[b.Secret] = b.Placeholder
		}
	}
	if len(bound) > 0 {
		for _, k := range api.SecretCAEnv {
			env[k] = api.SecretCABundle
		}
	}
}

// record makes a sandbox's CA and records its bindings; the caller has
// inserted its record.
func (s *secretStore) record(ctx context.Context, id string, bound []secrets.Bound, ca *secrets.CA) error {
	js, err := json.Marshal(bound)
	if err != nil {
		return err
	}
	if err := s.store.PutSandboxSecrets(ctx, id, store.SandboxSecrets{Bound: js, CACert: ca.CertPEM, CAKey: s.box.Seal("ca:"+id, ca.KeyDER())}); err != nil {
		return err
	}
	s.forget(id) // read again, with them
	return nil
}

func hostsOf(bound []secrets.Bound) []string {
	var hosts []string
	for _, b := range bound {
		hosts = append(hosts, b.Hosts...)
	}
	return hosts
}

// load returns a sandbox's bindings and CA (nil bindings: none).
func (s *secretStore) load(ctx context.Context, id string) ([]secrets.Bound, *secrets.CA, error) {
	ss, ok, err := s.store.GetSandboxSecrets(ctx, id)
	if err != nil || !ok {
		return nil, nil, err
	}
	var bound []secrets.Bound
	if err := json.Unmarshal(ss.Bound, &bound); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s: its secret bindings: %w", id, err)
	}
	key, err := s.box.Open("ca:"+id, ss.CAKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := secrets.LoadCA(ss.CACert, key)
	if err != nil {
		return nil, nil, err
	}
	return bound, ca, nil
}

// interceptor returns sandbox id's interceptor, nil when it has no
// bindings (a nil interface, not a nil pointer in one).
func (s *secretStore) interceptor(id string) egress.Interceptor {
	if sb := s.sandbox(id); sb != nil {
		return sb
	}
	return nil
}

// sandbox returns sandbox id's interceptor (nil: it has no bindings),
// read from the store on first use.
func (s *secretStore) sandbox(id string) *secrets.Sandbox {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	gen := s.gen
	s.mu.Unlock()
	if ok {
		return sb
	}
	bound, ca, err := s.load(context.Background(), id)
	if err != nil {
		// Its placeholders then go out as they are: worthless.
		s.log.Error("secrets: a sandbox's bindings cannot be read: its requests go out with placeholders", "sandbox", id, "err", err)
		return nil
	}
	if len(bound) > 0 {
		sb = &secrets.Sandbox{CA: ca, Bound: bound, Value: s.value, Log: s.log,
			OnRefused: func(r secrets.Refusal) {
				if s.refused != nil {
					s.refused(id, r)
				}
			}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.sandboxes[id]; ok {
		return cur // another read filled it first: one interceptor per sandbox
	}
	if s.gen == gen { // else recorded or removed meanwhile
		s.sandboxes[id] = sb
	}
	return sb
}

// forget drops a removed sandbox's interceptor.
func (s *secretStore) forget(id string) {
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.changed("sandbox:" + id)
	s.mu.Unlock()
	if sb != nil {
		sb.Close()
	}
}

// closeIdle closes the upstream connections a sandbox's interceptor
// keeps, when its network goes (a pause, a stop, a removal).
func (s *secretStore) closeIdle(id string) {
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb != nil {
		sb.Close()
	}
}

// forkBindings returns what a fork of src holds: the bindings marked
// inherit, each with a new placeholder, in env (a copy of src's, with
// the other bindings' placeholders gone); every placeholder of src's,
// retired (refused with a clear reason: its processes restored from the
// snapshot still hold them); and src's CA (its files and processes
// trust it already).
func (s *secretStore) forkBindings(ctx context.Context, src *core.Sandbox) (map[string]string, []secrets.Bound, *secrets.CA, error) {
	env := maps.Clone(src.Env)
	if env == nil {
		env = map[string]string{}
	}
	bound, ca, err := s.load(ctx, src.ID)
	if err != nil || len(bound) == 0 {
		return env, nil, nil, err
	}
	var out []secrets.Bound
	for _, b := range bound {
		if !b.Retired {
			delete(env, b.Secret)
			if b.Inherit {
				out = append(out, secrets.Bound{Binding: b.Binding, Placeholder: secrets.NewPlaceholder(), SecretID: b.SecretID})
			}
		}
		b.Retired = true
		out = append(out, b)
	}
	setSecretEnv(env, out)
	return env, out, ca, nil
}

// secretBindings is what the API shows of a sandbox's bindings.
func (m *Manager) secretBindings(id string) []api.SecretBinding {
	sb := m.secrets.sandbox(id)
	if sb == nil {
		return nil
	}
	var out []api.SecretBinding
	for _, b := range sb.Bound {
		if !b.Retired {
			out = append(out, api.SecretBinding{Secret: b.Secret, Binding: b.Binding.String(), Placeholder: b.Placeholder})
		}
	}
	return out
}
