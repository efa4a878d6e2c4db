package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/policy"
)

// commitRE is a commit ID: SHA-1 or SHA-256.
var commitRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

var branchRE = regexp.MustCompile(`^[A-Za-z0-9._/][A-Za-z0-9._/-]{0,199}$`)

// checkRepo checks a create's --repo, --branch and --path (nil: none).
func checkRepo(req api.CreateSandboxRequest) (*core.Repo, error) {
	if req.Repo == "" {
		if req.Branch != "" || req.RepoPath != "" {
			return nil, errdefs.Invalid("--branch and --path go with --repo")
		}
		return nil, nil
	}
	u, err := url.Parse(req.Repo)
	if err != nil || u.Host == "" || u.Scheme != "https" {
		return nil, errdefs.Invalid("repository %q: give an https:// URL (a private one's credential is a secret bound to its host: --secret NAME@HOST)", req.Repo)
	}
	if u.User != nil {
		return nil, errdefs.Invalid("repository %q holds a credential: bind it as a secret instead (nook secret set NAME; --secret NAME@%s), so that the sandbox never holds it", u.Redacted(), u.Hostname())
	}
	if req.Branch != "" && (!branchRE.MatchString(req.Branch) || strings.Contains(req.Branch, "..")) {
		return nil, errdefs.Invalid("branch %q is not a branch name", req.Branch)
	}
	p := req.RepoPath
	if p == "" {
		p = "/workspace"
	}
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return nil, errdefs.Invalid("--path %q: give an absolute path to a new directory", p)
	}
	return &core.Repo{URL: u.String(), Branch: req.Branch, Path: p}, nil
}

// cloneRepo clones a create's repository into the sandbox, its output
// to progress. A secret bound to the repository's host is its
// credential: a git credential helper (in the clone's config, for later
// fetches and pushes too) hands git the secret's placeholder, which the
// host replaces on the way out. The commit checked out is recorded.
func (m *Manager) cloneRepo(ctx context.Context, sb *core.Sandbox, repo core.Repo, progress io.Writer) error {
	c, err := m.agentFor(sb)
	if err != nil {
		return err
	}
	if progress == nil {
		progress = io.Discard
	}
	u, _ := url.Parse(repo.URL)
	var helper string
	if ss := m.secrets.sandbox(sb.ID); ss != nil {
		host := policy.NormalizeName(u.Hostname())
		for _, b := range ss.Bound {
			if !b.Retired && b.Header == "Authorization" && b.MatchesHost(host) {
				helper = fmt.Sprintf(`!f() { test "$1" = get && printf 'username=x-access-token\npassword=%%s\n' "$%s"; }; f`, b.Secret)
				break
			}
		}
	}
	argv := []string{"git"}
	if helper != "" {
		argv = append(argv, "-c", "credential.helper="+helper)
	}
	argv = append(argv, "clone", "--progress")
	if repo.Branch != "" {
		argv = append(argv, "--branch", repo.Branch)
	}
	argv = append(argv, "--", repo.URL, repo.Path)
	fmt.Fprintf(progress, "cloning %s into %s\n", repo.URL, repo.Path)
	var tail tailBuffer
	// git redraws its progress with carriage returns: lines for the stream.
	if _, err := m.run(ctx, c, argv, io.MultiWriter(crlf{progress}, &tail)); err != nil {
		return fmt.Errorf("clone %s: %w:\n%s", repo.URL, err, tail.String())
	}
	if helper != "" {
		if _, err := m.run(ctx, c, []string{"git", "-C", repo.Path, "config", "credential.helper", helper}, progress); err != nil {
			return fmt.Errorf("clone %s: its credential helper: %w", repo.URL, err)
		}
	}
	out, err := m.run(ctx, c, []string{"git", "-C", repo.Path, "rev-parse", "HEAD"}, nil)
	if err != nil {
		return fmt.Errorf("clone %s: its commit: %w", repo.URL, err)
	}
	repo.Commit = strings.TrimSpace(out)
	if !commitRE.MatchString(repo.Commit) {
		return fmt.Errorf("clone %s: git rev-parse HEAD answered %q, not a commit", repo.URL, repo.Commit)
	}
	fmt.Fprintf(progress, "cloned %s at %s\n", repo.URL, repo.Commit)
	sb.Repo = repo
	return m.store.SetSandboxRepo(ctx, sb.ID, repo)
}

// run runs argv in the sandbox with its environment, its output to out
// (nil: kept and returned); a failure says how it ended.
func (m *Manager) run(ctx context.Context, c *agent.Client, argv []string, out io.Writer) (string, error) {
	var buf bytes.Buffer
	if out == nil {
		out = &buf
	}
	st, err := execTo(ctx, c, &agent.ExecRequest{Argv: argv, TimeoutMS: 30 * 60 * 1000}, out)
	switch {
	case err != nil:
		return "", err
	case st.Signal != "":
		return "", errdefs.Invalid("%s was killed by SIG%s", argv[0], st.Signal)
	case st.ExitCode == 127:
		return "", errdefs.Invalid("the template has no %s", argv[0])
	case st.ExitCode != 0:
		return "", errdefs.Invalid("%s exited with code %d (see its output above; a refused connection is in `nook net log`)", argv[0], st.ExitCode)
	}
	return buf.String(), nil
}

// execTo runs a process in the sandbox, its output to out, and returns
// how it ended.
func execTo(ctx context.Context, c *agent.Client, req *agent.ExecRequest, out io.Writer) (api.ExitStatus, error) {
	var st api.ExitStatus
	p, err := c.Exec(ctx, req)
	if err != nil {
		return st, err
	}
	defer p.Close()
	for {
		kind, data, err := p.Next()
		if err != nil {
			return st, err
		}
		switch kind {
		case api.FrameStdout, api.FrameStderr:
			out.Write(data)
		case api.FrameExit:
			return st, json.Unmarshal(data, &st)
		}
	}
}

// crlf writes to w with every carriage return a line feed.
type crlf struct{ w io.Writer }

func (c crlf) Write(p []byte) (int, error) {
	if _, err := c.w.Write(bytes.ReplaceAll(p, []byte("\r"), []byte("\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// tailBuffer keeps the last 2 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }
