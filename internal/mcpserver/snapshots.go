package mcpserver

import (
	"context"
	"errors"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nookhq/nook/api"
)

func addSnapshotTools(s *mcp.Server, t *tools) {
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_snapshot", Description: "Save a named snapshot of a sandbox: its whole disk, and on a sandbox created with isolation \"vm\" also its memory, so running processes (servers, shells, builds), open files and connections are kept too. " +
		"A container sandbox's snapshot holds its files only: after a rollback or fork its processes start afresh (start servers again). " +
		"The sandbox keeps running; it stops only for a moment. Take one before anything risky or before trying an approach you may want to undo: " +
		"snapshot, try approach 1, sandbox_rollback to the snapshot, try approach 2 (or sandbox_fork the snapshot to try several at once). " +
		"Returns the snapshot (its name, id, parent, and memory: whether it holds running processes)."}, t.snapshot)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_snapshots", Description: "List a sandbox's snapshots, oldest first, each with its name, id, parent (the snapshot it was taken on top of, so they form a tree), " +
		"creation time, the disk it uses and whether it holds memory (running processes) as well as files. Use it to find the snapshot to roll back to or fork."}, t.snapshots)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_rollback", Description: "Put a sandbox back exactly to one of its snapshots: files, and running processes and servers where the snapshot holds memory, as they were when it was taken. " +
		"Everything done since then is lost (take a snapshot first to keep it); the sandbox's other snapshots stay, so you can roll back to a later one too. " +
		"Use it to undo a failed attempt and try another approach from the same starting point. The sandbox is running afterwards. Returns the sandbox."}, t.rollback)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_fork", Description: "Make independent copies of a sandbox, each a new sandbox with its own name, hostname and network address, starting with the same files and (from a vm sandbox) the same running processes. " +
		"Without snapshot the copies start from the sandbox as it is now (a snapshot named fork-... is taken for it); with snapshot, from that snapshot. " +
		"Nothing written in one copy is seen in another or in the original. Use it to try several approaches in parallel from one starting point, then destroy the copies you do not need. " +
		"Returns the new sandboxes."}, t.fork)
}

// SnapshotInput is sandbox_snapshot's input.
type SnapshotInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Name    string `json:"name,omitempty" jsonschema:"a name for the snapshot, unique within the sandbox (lowercase letters, digits, '-'), e.g. before-upgrade; default snap-N"`
}

func (t *tools) snapshot(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotInput) (*mcp.CallToolResult, any, error) {
	sn, err := t.c.CreateSnapshot(ctx, in.Sandbox, in.Name)
	if err != nil {
		return failSnapshot(err)
	}
	return nil, sn, nil
}

// SnapshotsOutput is sandbox_snapshots' output.
type SnapshotsOutput struct {
	Snapshots []api.Snapshot `json:"snapshots"`
}

func (t *tools) snapshots(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	l, err := t.c.ListSnapshots(ctx, in.Sandbox)
	if err != nil {
		return failSnapshot(err)
	}
	if l == nil {
		l = []api.Snapshot{}
	}
	return nil, SnapshotsOutput{Snapshots: l}, nil
}

// RollbackInput is sandbox_rollback's input.
type RollbackInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's name"`
	Snapshot string `json:"snapshot" jsonschema:"the name (or id) of one of this sandbox's snapshots, as sandbox_snapshots lists them"`
}

func (t *tools) rollback(ctx context.Context, _ *mcp.CallToolRequest, in RollbackInput) (*mcp.CallToolResult, any, error) {
	if in.Snapshot == "" {
		return fail(errors.New("snapshot is empty: give the name of one of the sandbox's snapshots (sandbox_snapshots lists them)"))
	}
	sb, err := t.c.Rollback(ctx, in.Sandbox, in.Snapshot)
	if err != nil {
		return failSnapshot(err)
	}
	return nil, sb, nil
}

// ForkInput is sandbox_fork's input.
type ForkInput struct {
	Sandbox  string `json:"sandbox" jsonschema:"the name of the sandbox to copy"`
	Snapshot string `json:"snapshot,omitempty" jsonschema:"one of the sandbox's snapshots to start the copies from; default: the sandbox as it is now"`
	Count    int    `json:"count,omitempty" jsonschema:"how many copies, 1 to 20; default 1"`
	Name     string `json:"name,omitempty" jsonschema:"the copy's name, or with count above 1 the prefix of NAME-1, NAME-2...; default SANDBOX-fork"`
}

// ForkOutput is sandbox_fork's output.
type ForkOutput struct {
	Sandboxes []api.Sandbox `json:"sandboxes"`
}

func (t *tools) fork(ctx context.Context, _ *mcp.CallToolRequest, in ForkInput) (*mcp.CallToolResult, any, error) {
	sbs, err := t.c.Fork(ctx, in.Sandbox, api.ForkRequest{Snapshot: in.Snapshot, Count: in.Count, Name: in.Name})
	if err != nil {
		return failSnapshot(err)
	}
	if sbs == nil {
		sbs = []api.Sandbox{}
	}
	return nil, ForkOutput{Sandboxes: sbs}, nil
}

// failSnapshot is fail with the API's CLI hints (flags, commands) also
// said in this server's terms, so a model knows which tool or argument to use.
func failSnapshot(err error) (*mcp.CallToolResult, any, error) {
	msg := err.Error()
	var hints []string
	if strings.Contains(msg, "--isolation vm") {
		hints = append(hints, `here: destroy it if you no longer need it and call sandbox_create with isolation "vm", then redo the setup there`)
	}
	if strings.Contains(msg, "--name") {
		hints = append(hints, "here: pass another name, or none for snap-N")
	}
	if strings.Contains(msg, "nook snapshots") {
		hints = append(hints, "here: sandbox_snapshots lists them")
	}
	if strings.Contains(msg, "nook ls") {
		hints = append(hints, "here: sandbox_list lists them")
	}
	if strings.Contains(msg, "nook rm") {
		hints = append(hints, "here: sandbox_destroy removes it")
	}
	if len(hints) > 0 {
		msg += " (" + strings.Join(hints, "; ") + ")"
	}
	return fail(errors.New(msg))
}
