package api

import "time"

// Snapshot is a saved state of a sandbox: its disk, and its memory
// (processes, open files, connections) when Memory is true.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Sandbox   string    `json:"sandbox"`
	Parent    string    `json:"parent,omitempty"` // the snapshot's parent ID, for the tree
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"` // the disk its own layers and memory take
	Memory    bool      `json:"memory"`
}

// CreateSnapshotRequest is the body of POST /v1/sandboxes/{name}/snapshots.
type CreateSnapshotRequest struct {
	Name string `json:"name,omitempty"` // default snap-N
}

// RollbackRequest is the body of POST /v1/sandboxes/{name}/rollback.
type RollbackRequest struct {
	Snapshot string `json:"snapshot"` // name or ID of one of the sandbox's snapshots
}

// ForkRequest is the body of POST /v1/sandboxes/{name}/fork.
type ForkRequest struct {
	Snapshot string `json:"snapshot,omitempty"` // one of the sandbox's snapshots; empty: a snapshot taken now
	Count    int    `json:"count,omitempty"`    // 1 to 20; default 1
	Name     string `json:"name,omitempty"`     // the fork's name, or with count > 1 the prefix of NAME-1..N; default SANDBOX-fork
}

// ForkResponse is the answer of POST /v1/sandboxes/{name}/fork.
type ForkResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}
