package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
)

// addQuotaFlags adds token create's --max-* flags, which fill req.Quotas.
func addQuotaFlags(c *cobra.Command, req *api.CreateTokenRequest) {
	var q api.TokenQuotas
	f := c.Flags()
	f.IntVar(&q.MaxSandboxes, "max-sandboxes", 0, "at most `N` sandboxes made by the token at once (0: no limit)")
	f.Float64Var(&q.MaxCPUs, "max-cpus", 0, "at most `N` CPUs in the token's sandboxes together")
	f.StringVar(&q.MaxMemory, "max-memory", "", "at most `SIZE` (e.g. 8G) of memory in the token's sandboxes together")
	f.StringVar(&q.MaxDisk, "max-disk", "", "at most `SIZE` (e.g. 50G) of disk in the token's sandboxes together (a backend's default disk counts; volumes do not)")
	f.IntVar(&q.MaxSnapshots, "max-snapshots", 0, "at most `N` snapshots of the token's sandboxes")
	f.StringVar(&q.MaxTTL, "max-ttl", "", "the longest TTL (`DURATION`, e.g. 2h) anyone may give a sandbox the token makes, or the token any sandbox: a longer one is refused, a create without --ttl gets at most this (each TTL, not the lifetime: extending again is allowed)")
	prev := c.PreRunE
	c.PreRunE = func(cmd *cobra.Command, args []string) error {
		if q != (api.TokenQuotas{}) {
			req.Quotas = &q
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

// quotaSummary is token ls's QUOTAS column: each quota as used/allowed.
func quotaSummary(t api.Token) string {
	q := t.Quotas
	if q == nil {
		return "-"
	}
	var u api.TokenUsage
	if t.Usage != nil {
		u = *t.Usage
	}
	var parts []string
	if q.MaxSandboxes > 0 {
		parts = append(parts, fmt.Sprintf("sandboxes %d/%d", u.Sandboxes, q.MaxSandboxes))
	}
	if q.MaxCPUs > 0 {
		parts = append(parts, fmt.Sprintf("cpus %s/%s", strconv.FormatFloat(u.CPUs, 'f', -1, 64), strconv.FormatFloat(q.MaxCPUs, 'f', -1, 64)))
	}
	if q.MaxMemory != "" {
		parts = append(parts, fmt.Sprintf("memory %s/%s", core.FormatBytes(u.MemoryBytes), q.MaxMemory))
	}
	if q.MaxDisk != "" {
		parts = append(parts, fmt.Sprintf("disk %s/%s", core.FormatBytes(u.DiskBytes), q.MaxDisk))
	}
	if q.MaxSnapshots > 0 {
		parts = append(parts, fmt.Sprintf("snapshots %d/%d", u.Snapshots, q.MaxSnapshots))
	}
	if q.MaxTTL != "" {
		parts = append(parts, "ttl<="+q.MaxTTL)
	}
	return strings.Join(parts, ", ")
}
