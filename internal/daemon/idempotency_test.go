package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// A key's first request does the work; a retry gets its answer (waiting
// for it while it runs), per token; another request with the key is
// refused; a failed one forgets the key.
func TestIdempotencyKeys(t *testing.T) {
	m := storeManager(t)
	ctx := WithTokenID(context.Background(), "tok-a")
	const route = "POST /v1/sandboxes"
	body := []byte(`{"name":"a"}`)
	cctx, call, again, err := m.BeginIdempotent(ctx, IdempotentCreate, "k1", route, body)
	if err != nil || call == nil || again != nil {
		t.Fatalf("first: %v %v %v", call, again, err)
	}
	if cctx.Value(idemCallKey{}) != call {
		t.Fatal("the call is not in its context")
	}
	// A retry while it runs waits for its answer.
	got := make(chan *IdempotentAnswer, 1)
	go func() {
		_, c, a, err := m.BeginIdempotent(ctx, IdempotentCreate, "k1", route, body)
		if err != nil || c != nil {
			t.Errorf("retry: %v %v", c, err)
		}
		got <- a
	}()
	select {
	case a := <-got:
		t.Fatalf("a retry answered before the first request ended: %+v", a)
	case <-time.After(50 * time.Millisecond): // it must still be waiting
	}
	call.Finish(ctx, IdempotentAnswer{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"x"}`)})
	select {
	case a := <-got:
		if a == nil || a.Status != 201 || string(a.Body) != `{"id":"x"}` || a.ContentType != "application/json" {
			t.Fatalf("retry's answer: %+v", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retry did not get the answer")
	}
	// Another body, or another route, with the key: refused.
	if _, _, _, err := m.BeginIdempotent(ctx, IdempotentCreate, "k1", route, []byte(`{"name":"b"}`)); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "another request") {
		t.Fatalf("other body: %v", err)
	}
	if _, _, _, err := m.BeginIdempotent(ctx, IdempotentFork, "k1", "POST /v1/sandboxes/a/fork", body); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("other route: %v", err)
	}
	// Another token's k1 is its own.
	_, call, _, err = m.BeginIdempotent(WithTokenID(context.Background(), "tok-b"), IdempotentCreate, "k1", route, body)
	if err != nil || call == nil {
		t.Fatalf("another token's key: %v %v", call, err)
	}
	// A failure forgets the key: the retry does the work.
	call.Finish(ctx, IdempotentAnswer{Status: 429})
	_, call, _, err = m.BeginIdempotent(WithTokenID(context.Background(), "tok-b"), IdempotentCreate, "k1", route, body)
	if err != nil || call == nil {
		t.Fatalf("after a failure: %v %v", call, err)
	}
	call.Finish(ctx, IdempotentAnswer{Status: 201})
	for _, k := range []string{strings.Repeat("k", 256), "tab\there", "é"} {
		if _, _, _, err := m.BeginIdempotent(ctx, IdempotentCreate, k, route, body); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("key %q: %v", k, err)
		}
	}
}

// A daemon killed between the work and the answer: after the restart
// (a new run), a retry gets what the request made; if nothing it made
// survived, the retry does the work again.
func TestIdempotencyAfterCrash(t *testing.T) {
	m := storeManager(t)
	ctx := WithTokenID(context.Background(), "tok")
	const route = "POST /v1/sandboxes/box/snapshots"
	insertBox(t, m, "sb1", 1, 1<<30)
	cctx, call, _, err := m.BeginIdempotent(ctx, IdempotentSnapshot, "snap-key", route, nil)
	if err != nil || call == nil {
		t.Fatal(call, err)
	}
	// The fork kind is not this request's: no link.
	if err := m.linkIdempotent(cctx, idemFork, "sb-other"); err != nil {
		t.Fatal(err)
	}
	if err := m.linkIdempotent(cctx, idemSnapshot, "snap-abc"); err != nil {
		t.Fatal(err)
	}
	if err := m.store.InsertSnapshot(ctx, &core.Snapshot{ID: "snap-abc", SandboxID: "sb1", Name: "first", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// ...and the daemon dies: no Finish. A new run:
	m.idem = newIdempotency()
	_, c, again, err := m.BeginIdempotent(ctx, IdempotentSnapshot, "snap-key", route, nil)
	if err != nil || c != nil || again == nil || again.Status != 201 || !strings.Contains(string(again.Body), `"id": "snap-abc"`) || !strings.Contains(string(again.Body), `"sandbox": "box-sb1"`) {
		t.Fatalf("retry after the crash: %v %+v %v", c, again, err)
	}
	// The answer is recorded now: the same again.
	_, _, again2, err := m.BeginIdempotent(ctx, IdempotentSnapshot, "snap-key", route, nil)
	if err != nil || again2 == nil || string(again2.Body) != string(again.Body) {
		t.Fatalf("second retry: %+v %v", again2, err)
	}
	// Died before what it made was recorded: the retry does it again.
	_, call, _, err = m.BeginIdempotent(ctx, IdempotentCreate, "create-key", "POST /v1/sandboxes", []byte(`{}`))
	if err != nil || call == nil {
		t.Fatal(call, err)
	}
	if err := m.linkIdempotent(context.WithValue(ctx, idemCallKey{}, call), idemSandbox, "never-recorded"); err != nil {
		t.Fatal(err)
	}
	m.idem = newIdempotency()
	_, call, again, err = m.BeginIdempotent(ctx, IdempotentCreate, "create-key", "POST /v1/sandboxes", []byte(`{}`))
	if err != nil || call == nil || again != nil {
		t.Fatalf("retry of a create that made nothing: %v %+v %v", call, again, err)
	}
	call.Finish(ctx, IdempotentAnswer{Status: 201, Body: []byte("ok")})
}

// Records expire after IdempotencyKeyTTL: an older one is replaced, and
// old rows are pruned.
func TestIdempotencyPrune(t *testing.T) {
	m := storeManager(t)
	ctx := context.Background()
	old := time.Now().Add(-IdempotencyKeyTTL - time.Hour)
	for _, k := range []string{"old-1", "old-2"} {
		if _, claimed, err := m.store.ClaimIdempotencyKey(ctx, store.IdempotencyRecord{Owner: "host", Key: k, Route: "POST /v1/sandboxes", BodyHash: []byte("h"), Boot: "b", CreatedAt: old}, old); err != nil || !claimed {
			t.Fatal(claimed, err)
		}
	}
	// Using a key prunes (the first time in a minute): old-2 goes.
	_, call, _, err := m.BeginIdempotent(ctx, IdempotentCreate, "old-1", "POST /v1/sandboxes/x/fork", nil)
	if err != nil || call == nil {
		t.Fatalf("an expired key is not free again: %v %v", call, err)
	}
	call.Finish(ctx, IdempotentAnswer{Status: 201})
	if n, err := m.store.PruneIdempotencyKeys(ctx, time.Now().Add(-IdempotencyKeyTTL)); err != nil || n != 0 {
		t.Fatalf("old rows left: %d %v", n, err)
	}
	if _, claimed, err := m.store.ClaimIdempotencyKey(ctx, store.IdempotencyRecord{Owner: "host", Key: "old-2", Route: "r", BodyHash: []byte("h"), Boot: "b", CreatedAt: time.Now()}, time.Time{}); err != nil || !claimed {
		t.Fatalf("old-2 not pruned: %v %v", claimed, err)
	}
	if _, claimed, err := m.store.ClaimIdempotencyKey(ctx, store.IdempotencyRecord{Owner: "host", Key: "old-1", Route: "r", BodyHash: []byte("h"), Boot: "b", CreatedAt: time.Now()}, time.Time{}); err != nil || claimed {
		t.Fatalf("the fresh old-1 was pruned: %v %v", claimed, err)
	}
}

// A first request fails while a retry waits for it, and another request
// claims the key the moment the failure forgets it (before the waiting
// retry goes on): the retries then wait for that request and get its
// answer; none takes the key over to do the work a second time.
func TestIdempotencyRetriesAroundAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := storeManager(t)
		ctx := WithTokenID(context.Background(), "tok")
		const route, key = "POST /v1/sandboxes", "k"
		body := []byte(`{"name":"a"}`)
		_, first, _, err := m.BeginIdempotent(ctx, IdempotentCreate, key, route, body)
		if err != nil || first == nil {
			t.Fatal(first, err)
		}
		type result struct {
			call *IdempotentCall
			ans  *IdempotentAnswer
			err  error
		}
		retry := func() chan result {
			ch := make(chan result, 1)
			go func() {
				_, c, a, err := m.BeginIdempotent(ctx, IdempotentCreate, key, route, body)
				ch <- result{c, a, err}
			}()
			synctest.Wait() // it waits (or, taking the key over, has ended)
			return ch
		}
		waiting := retry()
		var next *IdempotentCall
		testHookIdempotentFinished = func(k string) {
			if next != nil {
				return
			}
			// The key is forgotten: a new request claims it now.
			var err error
			if _, next, _, err = m.BeginIdempotent(ctx, IdempotentCreate, k, route, body); err != nil || next == nil {
				t.Errorf("the claim after the failure: %v %v", next, err)
			}
		}
		t.Cleanup(func() { testHookIdempotentFinished = nil })
		first.Finish(ctx, IdempotentAnswer{Status: 500})
		if next == nil {
			t.Fatal("no request claimed the key after the failure")
		}
		late := retry()
		next.Finish(ctx, IdempotentAnswer{Status: 201, ContentType: "application/json", Body: []byte(`{"id":"once"}`)})
		for _, ch := range []chan result{waiting, late} {
			select {
			case r := <-ch:
				if r.call != nil {
					t.Errorf("a retry took the key over to do the work again, beside the request that claimed it")
					r.call.Finish(ctx, IdempotentAnswer{Status: 500}) // lets the other retry end
				} else if r.err != nil || r.ans == nil || string(r.ans.Body) != `{"id":"once"}` {
					t.Errorf("a retry's answer: %+v %v; want the answer of the request that claimed the key", r.ans, r.err)
				}
			case <-time.After(time.Minute):
				t.Fatal("a retry did not get the answer")
			}
		}
	})
}
