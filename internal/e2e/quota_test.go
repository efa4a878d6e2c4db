package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// Token quotas and idempotency keys, end to end over the TCP listener:
// a token's creates stop at its quotas with 429 saying what is used and
// allowed (parallel ones too), a removal makes room, --max-ttl refuses a
// longer TTL; a create retried with its Idempotency-Key gets the same
// sandbox, the key with another body is refused, and a daemon killed
// after the sandbox was made but before it answered gives the retry that
// sandbox after its restart, never a second one.
func TestQuotasAndIdempotency(t *testing.T) {
	addr := freeAddr(t)
	d := newDaemon(t, "--listen", addr)
	tcpEnv := func() []string {
		var info api.Info
		if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil {
			t.Fatal(err)
		}
		return []string{"NOOK_HOST=https://" + addr, "NOOK_TLS_FINGERPRINT=" + info.TLSFingerprint}
	}
	tcp := tcpEnv()
	ci := strings.TrimSpace(d.must("token", "create", "--name", "ci", "--max-sandboxes", "2", "--max-memory", "1G", "--max-ttl", "1h"))
	as := append(tcp, "NOOK_TOKEN="+ci)
	mustAs := func(args ...string) string {
		t.Helper()
		r, err := d.nookEnv(as, args...)
		if err != nil || r.code != 0 {
			t.Fatalf("nook %v as ci: %+v %v", args, r, err)
		}
		return strings.TrimSpace(r.stdout)
	}
	refused := func(want string, args ...string) {
		t.Helper()
		r, err := d.nookEnv(as, args...)
		if err != nil || r.code != 1 || !strings.Contains(r.stderr, want) {
			t.Fatalf("nook %v as ci: %+v %v; want it refused with %q", args, r, err, want)
		}
	}
	mustAs("create", "--name", "q-a", "--memory", "256M")
	// Two creates in parallel for the last slot: one passes.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made []string
	var errs []string
	for _, n := range []string{"q-b", "q-c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.nookEnv(as, "create", "--name", n, "--memory", "256M")
			mu.Lock()
			defer mu.Unlock()
			if err == nil && r.code == 0 {
				made = append(made, n)
			} else {
				errs = append(errs, r.stderr)
			}
		}()
	}
	wg.Wait()
	if len(made) != 1 || len(errs) != 1 || !strings.Contains(errs[0], "token ci: 2 of 2 sandboxes in use (--max-sandboxes 2)") {
		t.Fatalf("parallel creates at the limit: made %v, errors %q", made, errs)
	}
	refused("token ci: 2 of 2 sandboxes in use (--max-sandboxes 2)", "create", "--name", "q-d", "--memory", "256M")
	// The API says 429 with the code the limits have.
	cl, err := sdk.NewWithOptions("https://"+addr, sdk.Options{Token: ci, TLSFingerprint: strings.TrimPrefix(tcp[1], "NOOK_TLS_FINGERPRINT=")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var se *sdk.Error
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Memory: "256M"}); !errors.As(err, &se) || se.Status != 429 || se.Code != api.CodeLimitReached {
		t.Fatalf("create over the quota through the API: %v", err)
	}
	// The host sees the token's quotas and use.
	if ls := d.must("token", "ls"); !strings.Contains(ls, "sandboxes 2/2, memory 512M/1G, ttl<=1h") {
		t.Fatalf("token ls:\n%s", ls)
	}
	// A removal makes room, but not for more memory than is left.
	d.must("rm", made[0])
	refused("token ci: 256M of 1G memory in use; creating this sandbox needs 1G more (--max-memory 1G)", "create", "--name", "q-e", "--memory", "1G")
	mustAs("create", "--name", "q-e", "--memory", "256M")
	// --max-ttl: a longer TTL is refused, at create and after.
	d.must("rm", "q-e")
	refused("token ci: ttl 2h is over its --max-ttl 1h", "create", "--name", "q-f", "--memory", "256M", "--ttl", "2h")
	refused("token ci: ttl 2h is over its --max-ttl 1h", "ttl", "q-a", "2h")
	mustAs("ttl", "q-a", "30m")

	// Idempotency keys, as another token (no quotas) through the SDK.
	secret := strings.TrimSpace(d.must("token", "create", "--name", "idem"))
	idem, err := sdk.NewWithOptions("https://"+addr, sdk.Options{Token: secret, TLSFingerprint: strings.TrimPrefix(tcp[1], "NOOK_TLS_FINGERPRINT=")})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		sbs, err := idem.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(sbs)
	}
	before := count()
	kctx := sdk.WithIdempotencyKey(ctx, "create-once")
	req := api.CreateSandboxRequest{Memory: "256M", Labels: map[string]string{"try": "1"}}
	first, err := idem.CreateSandbox(kctx, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := idem.CreateSandbox(kctx, req)
	if err != nil || again.ID != first.ID || again.Name != first.Name {
		t.Fatalf("retry: %+v %v; want sandbox %s again", again, err, first.ID)
	}
	if n := count(); n != before+1 {
		t.Fatalf("%d sandboxes after a create and its retry, want %d", n, before+1)
	}
	req.Memory = "512M"
	if _, err := idem.CreateSandbox(kctx, req); !errors.As(err, &se) || se.Status != 409 || !strings.Contains(se.Message, "first used with another request") {
		t.Fatalf("the key with another body: %v", err)
	}
	d.must("rm", first.Name)
	before = count()

	// The daemon dies after making the sandbox, before answering.
	d.stop(syscall.SIGTERM)
	d.env = []string{"NOOK_TEST_DIE_BEFORE_IDEMPOTENT_ANSWER=1"}
	d.start()
	idem, err = sdk.NewWithOptions("https://"+addr, sdk.Options{Token: secret, TLSFingerprint: strings.TrimPrefix(tcpEnv()[1], "NOOK_TLS_FINGERPRINT=")})
	if err != nil {
		t.Fatal(err)
	}
	kctx = sdk.WithIdempotencyKey(ctx, "survives-kill-9")
	req = api.CreateSandboxRequest{Memory: "256M"} // no name: a second create would make another sandbox
	if sb, err := idem.CreateSandbox(kctx, req); err == nil {
		t.Fatalf("the daemon answered (%s) instead of dying", sb.Name)
	}
	d.stop(syscall.SIGKILL) // reaps it: it killed itself
	if !strings.Contains(d.log.String(), "killing the daemon before it answers") {
		t.Fatalf("the daemon did not die at the hook:\n%s", d.log.String())
	}
	d.env = nil
	d.start()
	idem, err = sdk.NewWithOptions("https://"+addr, sdk.Options{Token: secret, TLSFingerprint: strings.TrimPrefix(tcpEnv()[1], "NOOK_TLS_FINGERPRINT=")})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := idem.CreateSandbox(kctx, req)
	if err != nil {
		t.Fatalf("retry after the restart: %v", err)
	}
	if n := count(); n != before+1 {
		t.Fatalf("%d sandboxes after the killed create and its retry, want %d", n, before+1)
	}
	got, err := idem.GetSandbox(ctx, sb.Name)
	if err != nil || got.ID != sb.ID || got.State != "running" {
		t.Fatalf("the retried sandbox: %+v %v", got, err)
	}
	// And the answer is kept from now on.
	if sb2, err := idem.CreateSandbox(kctx, req); err != nil || sb2.ID != sb.ID {
		t.Fatalf("second retry: %+v %v", sb2, err)
	}
	if out := d.must("exec", sb.Name, "--", "echo", "alive"); out != "alive\n" {
		t.Fatalf("exec in the retried sandbox: %q", out)
	}
}
