package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// Idempotency keys (the Idempotency-Key header of a create, fork or
// snapshot): the first request with a key does the work; a retry with the
// same key and the same request gets the first one's answer instead of a
// second sandbox.
//
// The key's record (the store's idempotency_keys, per caller: a token's
// ID, or "host" for the Unix socket without a token, so no token ever
// sees another's answers) is claimed before the work starts. The ID of
// each thing the request makes (sandbox, fork, snapshot) is added to it
// before that thing's own record is written, and the answer once it is
// known. So a daemon killed at any point leaves a record from which a
// retry after the restart answers: with the recorded answer, or, if the
// daemon died before it, with what the request made (its current view,
// 201), or, if nothing it made survived (a create cut short is removed
// at the restart), by doing the work again. A retry while the first
// request is still under way waits for it. A request that fails forgets
// its key: a retry does the work again (as nothing was made, or, for a
// fork that failed part way, what was made stays listed).
//
// A key is 1-255 printable ASCII characters. A key reused with another
// request (another route, or another body) is refused (409). Records
// expire after IdempotencyKeyTTL; older ones are pruned as keys are used.
type idempotency struct {
	boot string // this daemon run's, beside each record it claims

	mu        sync.Mutex
	running   map[string]chan struct{} // by owner and key: closed when the request ends
	lastPrune time.Time
}

// IdempotencyKeyTTL is how long a key's answer is kept.
const IdempotencyKeyTTL = 24 * time.Hour

// MaxIdempotencyKey is the longest key.
const MaxIdempotencyKey = 255

// What an idempotent request makes.
const (
	IdempotentCreate   = "create"
	IdempotentFork     = "fork"
	IdempotentSnapshot = "snapshot"

	idemSandbox  = IdempotentCreate
	idemFork     = IdempotentFork
	idemSnapshot = IdempotentSnapshot
)

func newIdempotency() *idempotency {
	b := make([]byte, 8)
	rand.Read(b)
	return &idempotency{boot: hex.EncodeToString(b), running: map[string]chan struct{}{}}
}

// IdempotentCall is a request under way with an idempotency key; its
// handler ends it with Finish.
type IdempotentCall struct {
	m                *Manager
	owner, key, kind string
	done             chan struct{}
	once             sync.Once
}

// IdempotentAnswer is an answer given again.
type IdempotentAnswer struct {
	Status      int
	ContentType string
	Body        []byte
}

type idemCallKey struct{}

// CheckIdempotencyKey refuses a key that is empty, longer than 255
// characters or not printable ASCII.
func CheckIdempotencyKey(key string) error {
	if key == "" || len(key) > MaxIdempotencyKey {
		return errdefs.Invalid("Idempotency-Key must be 1 to %d characters", MaxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return errdefs.Invalid("Idempotency-Key must be printable ASCII")
		}
	}
	return nil
}

// BeginIdempotent starts a request of kind (IdempotentCreate...) with an
// idempotency key: route names the request (method, path and query) and
// body is its body. It returns either a call (the request is the key's
// first: do it with the returned ctx, then Finish) or the answer to give
// again.
func (m *Manager) BeginIdempotent(ctx context.Context, kind, key, route string, body []byte) (context.Context, *IdempotentCall, *IdempotentAnswer, error) {
	if err := CheckIdempotencyKey(key); err != nil {
		return ctx, nil, nil, err
	}
	owner := tokenIDFrom(ctx)
	if owner == "" {
		owner = "host"
	}
	sum := sha256.Sum256(body)
	ix := m.idem
	id := owner + "\x00" + key
	for {
		now := time.Now()
		ix.mu.Lock()
		if now.Sub(ix.lastPrune) > time.Minute {
			ix.lastPrune = now
			if n, err := m.store.PruneIdempotencyKeys(ctx, now.Add(-IdempotencyKeyTTL)); err != nil {
				m.log.Warn("prune idempotency keys", "err", err)
			} else if n > 0 {
				m.log.Debug("pruned idempotency keys", "n", n)
			}
		}
		rec, claimed, err := m.store.ClaimIdempotencyKey(ctx, store.IdempotencyRecord{
			Owner: owner, Key: key, Route: route, BodyHash: sum[:], Boot: ix.boot, CreatedAt: now,
		}, now.Add(-IdempotencyKeyTTL))
		if err != nil {
			ix.mu.Unlock()
			return ctx, nil, nil, err
		}
		start := func() (context.Context, *IdempotentCall, *IdempotentAnswer, error) {
			c := &IdempotentCall{m: m, owner: owner, key: key, kind: kind, done: make(chan struct{})}
			ix.running[id] = c.done
			ix.mu.Unlock()
			return context.WithValue(ctx, idemCallKey{}, c), c, nil, nil
		}
		switch {
		case claimed:
			return start()
		case rec.Route != route || !bytes.Equal(rec.BodyHash, sum[:]):
			ix.mu.Unlock()
			return ctx, nil, nil, errdefs.Precondition("Idempotency-Key %q was first used with another request (%s, with its own body): send a new key for a new request", clipKey(key), rec.Route)
		case rec.Status != 0:
			ix.mu.Unlock()
			ans := decodeAnswer(rec.Status, rec.Response)
			return ctx, nil, &ans, nil
		}
		if ch, ok := ix.running[id]; ok && rec.Boot == ix.boot {
			// Under way: wait for its end, then look again.
			ix.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx, nil, nil, ctx.Err()
			}
		}
		// Claimed by a daemon that died before it answered: answer with
		// what it made, if any of it is still there; else do it again.
		if ans, ok := m.answerFromLinks(ctx, kind, route, rec.Links); ok {
			if err := m.store.AnswerIdempotencyKey(ctx, owner, key, ans.Status, encodeAnswer(ans)); err != nil {
				ix.mu.Unlock()
				return ctx, nil, nil, err
			}
			ix.mu.Unlock()
			return ctx, nil, &ans, nil
		}
		if err := m.store.TakeOverIdempotencyKey(ctx, owner, key, ix.boot); err != nil {
			ix.mu.Unlock()
			return ctx, nil, nil, err
		}
		return start()
	}
}

func clipKey(k string) string {
	if len(k) > 40 {
		return k[:40] + "..."
	}
	return k
}

// Finish records the answer of a call (a 2xx one is kept for retries;
// another forgets the key) and lets waiting retries go on. A second call
// does nothing.
//
// The record and the call's entry in running change together, under the
// lock BeginIdempotent claims under: once the key is forgotten, a new
// request may claim it and put its own entry in running, which this call
// must leave alone (a retry waking from this call's end finds it and
// waits for that request, instead of taking the key over and doing the
// work a second time).
func (c *IdempotentCall) Finish(ctx context.Context, ans IdempotentAnswer) {
	c.once.Do(func() {
		ix := c.m.idem
		id := c.owner + "\x00" + c.key
		ix.mu.Lock()
		var err error
		if ans.Status >= 200 && ans.Status < 300 {
			err = c.m.store.AnswerIdempotencyKey(ctx, c.owner, c.key, ans.Status, encodeAnswer(ans))
		} else {
			err = c.m.store.ReleaseIdempotencyKey(ctx, c.owner, c.key)
		}
		if ix.running[id] == c.done {
			delete(ix.running, id)
		}
		ix.mu.Unlock()
		if err != nil {
			c.m.log.Error("record an idempotency key's answer", "key", clipKey(c.key), "err", err)
		}
		if testHookIdempotentFinished != nil {
			testHookIdempotentFinished(c.key)
		}
		close(c.done)
	})
}

// testHookIdempotentFinished, set by tests alone, runs once a call's
// answer is recorded (or its key forgotten), before the retries waiting
// for it go on.
var testHookIdempotentFinished func(key string)

// linkIdempotent adds id, about to be recorded, to what the idempotent
// request of ctx makes, if that request is of kind (a fork's implicit
// snapshot is no answer to it).
func (m *Manager) linkIdempotent(ctx context.Context, kind, id string) error {
	c, _ := ctx.Value(idemCallKey{}).(*IdempotentCall)
	if c == nil || c.kind != kind {
		return nil
	}
	return m.store.LinkIdempotencyKey(context.WithoutCancel(ctx), c.owner, c.key, id)
}

// answerFromLinks builds the answer of a request from what it made (the
// views of those that still exist); ok is false if none does.
func (m *Manager) answerFromLinks(ctx context.Context, kind, route string, links []string) (IdempotentAnswer, bool) {
	var v any
	switch kind {
	case idemSandbox:
		if len(links) == 0 {
			return IdempotentAnswer{}, false
		}
		sb, err := m.store.GetSandboxByID(ctx, links[len(links)-1])
		if err != nil {
			return IdempotentAnswer{}, false
		}
		view := m.View(sb)
		if strings.Contains(route, "progress=") {
			b, _ := json.Marshal(api.CreateEvent{Sandbox: &view})
			return IdempotentAnswer{Status: 200, ContentType: "application/x-ndjson", Body: append(b, '\n')}, true
		}
		v = view
	case idemFork:
		resp := api.ForkResponse{Sandboxes: []api.Sandbox{}}
		for _, id := range links {
			if sb, err := m.store.GetSandboxByID(ctx, id); err == nil {
				resp.Sandboxes = append(resp.Sandboxes, m.View(sb))
			}
		}
		if len(resp.Sandboxes) == 0 {
			return IdempotentAnswer{}, false
		}
		v = resp
	case idemSnapshot:
		if len(links) == 0 {
			return IdempotentAnswer{}, false
		}
		sn, err := m.store.GetSnapshot(ctx, "", links[len(links)-1])
		if err != nil {
			return IdempotentAnswer{}, false
		}
		if sb, err := m.store.GetSandboxByID(ctx, sn.SandboxID); err == nil {
			sn.Sandbox = sb.Name
		}
		v = sn.API()
	default:
		return IdempotentAnswer{}, false
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return IdempotentAnswer{}, false
	}
	return IdempotentAnswer{Status: 201, ContentType: "application/json", Body: append(b, '\n')}, true
}

// An answer is stored as its content type, a newline, and its body.
func encodeAnswer(a IdempotentAnswer) []byte {
	return append([]byte(a.ContentType+"\n"), a.Body...)
}

func decodeAnswer(status int, b []byte) IdempotentAnswer {
	ct, body, ok := bytes.Cut(b, []byte("\n"))
	if !ok {
		return IdempotentAnswer{Status: status, ContentType: "application/json", Body: b}
	}
	return IdempotentAnswer{Status: status, ContentType: string(ct), Body: body}
}
