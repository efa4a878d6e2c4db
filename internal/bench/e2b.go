package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/e2b"
	"github.com/nookhq/nook/internal/e2b/envdpb/process"
	"github.com/nookhq/nook/internal/e2b/envdpb/process/processconnect"
)

//go:embed e2b.mjs
var e2bScript []byte

// e2bRounds and e2bExecs are how many creates and round trips each SDK
// makes.
const e2bRounds, e2bExecs = 8, 50

// runE2B measures E2B's JS SDK (the npm package make deps installs into
// .cache/e2b-sdk) against the daemon's E2B edge, beside nook's Go SDK
// doing the same on the same daemon: create -> first output of `echo
// hi` (a warm pool of 2, refilled between rounds), and a command's round
// trip. Both create from the template E2B's base is (nook's e2b recipe),
// and run each command as E2B does, `bash -l -c CMD` as its user.
func runE2B(ctx context.Context, cfg Config, root string) error {
	wd, _ := os.Getwd()
	module := filepath.Join(wd, ".cache", "e2b-sdk", "node_modules", "e2b", "dist", "index.mjs")
	if _, err := os.Stat(module); err != nil {
		fmt.Fprintf(cfg.Out, "E2B SDK figures skipped: E2B's SDK is not installed in %s (make deps installs it)\n", filepath.Join(wd, ".cache", "e2b-sdk"))
		return nil
	}
	if _, err := exec.LookPath("node"); err != nil {
		fmt.Fprintln(cfg.Out, "E2B SDK figures skipped: node is not installed (make deps installs npm, which brings it)")
		return nil
	}
	fmt.Fprintln(cfg.Out, "E2B's JS SDK against nook's E2B edge, beside nook's Go SDK...")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	cfg.e2bListen = addr
	cl, stop, err := serve(ctx, cfg, filepath.Join(root, "e2b"), 2)
	if err != nil {
		return err
	}
	defer stop()
	tok, err := cl.CreateToken(ctx, api.CreateTokenRequest{Name: "bench-e2b", E2B: true, TTL: "1h"})
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the warm pool fills, as on a daemon up a while

	var goCreate, goRun []time.Duration
	for i := range e2bRounds {
		time.Sleep(time.Second) // the pool refills
		name := fmt.Sprintf("bench-e2b-%d", i)
		start := time.Now()
		if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name, Template: "e2b"}); err != nil {
			return err
		}
		fw := &firstWrite{start: start}
		if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"/bin/bash", "-l", "-c", "echo hi"}}, fw, io.Discard); err != nil {
			return err
		}
		goCreate = append(goCreate, fw.at)
		if i == 0 {
			for range e2bExecs {
				start := time.Now()
				if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"/bin/bash", "-l", "-c", "true"}}, io.Discard, io.Discard); err != nil {
					return err
				}
				goRun = append(goRun, time.Since(start))
			}
		}
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return err
		}
	}

	// The same through the edge from Go (a Connect client of envd's
	// protos, plain HTTP for the control API): what the edge costs
	// apart from the JS SDK's own time.
	edgeCreate, edgeRun, err := edgeRounds(ctx, "http://"+addr, tok.Secret)
	if err != nil {
		return fmt.Errorf("the edge from Go: %w", err)
	}

	script := filepath.Join(root, "e2b-bench.mjs")
	if err := os.WriteFile(script, e2bScript, 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+tok.Secret,
		"E2B_SDK_MODULE="+module, "ROUNDS="+strconv.Itoa(e2bRounds), "EXECS="+strconv.Itoa(e2bExecs))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("the E2B SDK's script: %v: %s", err, stderr.String())
	}
	var res struct{ Create, Run []float64 }
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("the E2B SDK's script printed %q: %w", out, err)
	}
	e2bCreate, e2bRun := millis(res.Create), millis(res.Run)

	fmt.Fprintln(cfg.Out)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "E2B SDK (e2b 2.51.0, Node)\tp50\tp99\tbaseline\tbaseline p50\tratio p50\ttarget")
	fmt.Fprintf(tw, "Sandbox.create() -> first output of commands.run('echo hi')\t%s\t%s\tnook's Go SDK, the same\t%s\t%.2fx\t<= 1.3x\n",
		ms(pct(e2bCreate, .5)), ms(pct(e2bCreate, .99)), ms(pct(goCreate, .5)), float64(pct(e2bCreate, .5))/float64(pct(goCreate, .5)))
	fmt.Fprintf(tw, "  the same through the edge from Go (HTTP and a Connect client)\t%s\t%s\tnook's Go SDK, the same\t%s\t%.2fx\t-\n",
		ms(pct(edgeCreate, .5)), ms(pct(edgeCreate, .99)), ms(pct(goCreate, .5)), float64(pct(edgeCreate, .5))/float64(pct(goCreate, .5)))
	fmt.Fprintf(tw, "commands.run('true') round trip\t%s\t%s\tnook's Go SDK exec of bash -l -c true\t%s\t%.2fx\tp50 <= 5ms\n",
		ms(pct(e2bRun, .5)), ms(pct(e2bRun, .99)), ms(pct(goRun, .5)), float64(pct(e2bRun, .5))/float64(pct(goRun, .5)))
	fmt.Fprintf(tw, "  the same through the edge from Go (a Connect client)\t%s\t%s\tnook's Go SDK exec of bash -l -c true\t%s\t%.2fx\t-\n",
		ms(pct(edgeRun, .5)), ms(pct(edgeRun, .99)), ms(pct(goRun, .5)), float64(pct(edgeRun, .5))/float64(pct(goRun, .5)))
	return tw.Flush()
}

// edgeRounds times, through the E2B edge from Go, a create (POST
// /v2/sandboxes) to the first output of `echo hi` (envd's Start, as the
// SDK sends it), and Start round trips of `true`.
func edgeRounds(ctx context.Context, base, key string) (create, run []time.Duration, err error) {
	newSandbox := func() (id, token string, err error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", "", err
		}
		defer res.Body.Close()
		var v struct{ SandboxID, EnvdAccessToken string }
		if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != http.StatusCreated {
			return "", "", fmt.Errorf("create: %d %v", res.StatusCode, err)
		}
		return v.SandboxID, v.EnvdAccessToken, nil
	}
	kill := func(id string) {
		req, _ := http.NewRequestWithContext(ctx, "DELETE", base+"/sandboxes/"+id, nil)
		req.Header.Set("X-API-Key", key)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}
	pc := processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON())
	start := func(id, token, cmd string, first func()) error {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}})
		req.Header().Set("E2b-Sandbox-Id", id)
		req.Header().Set("E2b-Sandbox-Port", e2b.EnvdPort)
		req.Header().Set("X-Access-Token", token)
		st, err := pc.Start(ctx, req)
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
			if first != nil && st.Msg().GetEvent().GetData() != nil {
				first()
				first = nil
			}
		}
		return st.Err()
	}
	for i := range e2bRounds {
		time.Sleep(time.Second) // the pool refills
		t0 := time.Now()
		id, token, err := newSandbox()
		if err != nil {
			return nil, nil, err
		}
		var at time.Duration
		if err := start(id, token, "echo hi", func() { at = time.Since(t0) }); err != nil {
			kill(id)
			return nil, nil, err
		}
		create = append(create, at)
		if i == 0 {
			for range e2bExecs {
				t := time.Now()
				if err := start(id, token, "true", nil); err != nil {
					kill(id)
					return nil, nil, err
				}
				run = append(run, time.Since(t))
			}
		}
		kill(id)
	}
	return create, run, nil
}

func millis(fs []float64) []time.Duration {
	out := make([]time.Duration, len(fs))
	for i, f := range fs {
		out[i] = time.Duration(f * float64(time.Millisecond))
	}
	return out
}
