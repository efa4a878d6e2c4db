package store

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"testing"
	"time"
)

// A sandbox's network record and log persist, the log keeps only its
// newest entries, and both go when the sandbox's record does.
func TestNetRecordAndLog(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandbox(ctx, sample("id1", "one")); err != nil {
		t.Fatal(err)
	}
	n := Net{Subnet: "10.89.0.0/30", Policy: []byte(`{"mode":"allowlist","allow":["example.com"]}`), Exposed: map[uint16]uint16{8000: 41000}}
	if err := s.PutNet(ctx, "id1", n); err != nil {
		t.Fatal(err)
	}
	n.Exposed[9000] = 42000
	if err := s.PutNet(ctx, "id1", n); err != nil {
		t.Fatal(err)
	}
	var entries []NetLogEntry
	for i := range 30 {
		entries = append(entries, NetLogEntry{SandboxID: "id1", Time: time.Unix(int64(i), 0), Kind: "dns", Destination: fmt.Sprintf("n%d.example", i), Reason: "not-allowed"})
	}
	entries = append(entries, NetLogEntry{SandboxID: "warm", Time: time.Now(), Kind: "dns", Destination: "x", Reason: "y"})
	if err := s.AppendNetLog(ctx, entries, 10); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, ok, err := s.GetNet(ctx, "id1")
	if err != nil || !ok || got.Subnet != n.Subnet || string(got.Policy) != string(n.Policy) || got.Exposed[9000] != 42000 || len(got.Exposed) != 2 {
		t.Fatalf("GetNet = %+v %v %v", got, ok, err)
	}
	if all, err := s.ListNets(ctx); err != nil || len(all) != 1 {
		t.Fatalf("ListNets = %v %v", all, err)
	}
	log, err := s.NetLog(ctx, "id1", 5)
	if err != nil || len(log) != 5 || log[0].Destination != "n25.example" || log[4].Destination != "n29.example" {
		t.Fatalf("NetLog = %+v %v", log, err)
	}
	if log, _ := s.NetLog(ctx, "id1", 100); len(log) != 10 {
		t.Fatalf("log kept %d entries, want 10", len(log))
	}
	if log, _ := s.NetLog(ctx, "warm", 100); len(log) != 0 {
		t.Fatalf("log of a sandbox without a record: %+v", log)
	}
	if err := s.DeleteSandbox(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.GetNet(ctx, "id1"); ok {
		t.Fatal("network record outlived its sandbox")
	}
	if log, _ := s.NetLog(ctx, "id1", 100); len(log) != 0 {
		t.Fatal("network log outlived its sandbox")
	}
}

// NetSubnets answers from memory what the table holds: a record put, put
// again with another subnet, and gone with its sandbox.
func TestNetSubnetsFollowTheTable(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	subnets := func() map[string]string {
		t.Helper()
		out := map[string]string{}
		if err := s.NetSubnets(ctx, func(id, subnet string) { out[id] = subnet }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, id := range []string{"a", "b"} {
		if err := s.InsertSandbox(ctx, sample(id, "n-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutNet(ctx, "a", Net{Subnet: "10.89.0.0/30"}); err != nil {
		t.Fatal(err)
	}
	if got := subnets(); len(got) != 1 || got["a"] != "10.89.0.0/30" { // loaded from the table
		t.Fatalf("NetSubnets = %v", got)
	}
	if err := s.PutNet(ctx, "b", Net{Subnet: "10.89.0.4/30"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNet(ctx, "a", Net{Subnet: "10.89.0.8/30"}); err != nil {
		t.Fatal(err)
	}
	if got := subnets(); len(got) != 2 || got["a"] != "10.89.0.8/30" || got["b"] != "10.89.0.4/30" {
		t.Fatalf("NetSubnets after puts = %v", got)
	}
	if err := s.DeleteSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListNets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := subnets()
	if len(got) != len(all) || got["b"] != all["b"].Subnet || len(got) != 1 {
		t.Fatalf("NetSubnets = %v, the table %v", got, all)
	}
}

// Network records queued beside sandboxes' writes are committed in the
// same transaction, and the subnets in memory follow what it committed:
// a put of each, none for a sandbox that has no record, and a removal.
func TestNetGroupCommit(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	s := openLoaded(t, path)
	for _, id := range []string{"a", "b", "gone"} {
		if err := s.InsertSandbox(ctx, sample(id, "n-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutNet(ctx, "gone", Net{Subnet: "10.89.0.12/30"}); err != nil {
		t.Fatal(err)
	}
	if err := s.NetSubnets(ctx, func(string, string) {}); err != nil { // loaded
		t.Fatal(err)
	}
	const n = 5
	errs := make([]error, n)
	queued(t, s, n, func(i int) {
		switch i {
		case 0:
			errs[i] = s.PutNet(ctx, "a", Net{Subnet: "10.89.0.0/30"})
		case 1:
			errs[i] = s.PutNet(ctx, "b", Net{Subnet: "10.89.0.4/30"})
		case 2:
			errs[i] = s.PutNet(ctx, "none", Net{Subnet: "10.89.0.8/30"}) // no sandbox: nothing recorded
		case 3:
			errs[i] = s.DeleteSandbox(ctx, "gone")
		case 4:
			errs[i] = s.InsertSandbox(ctx, sample("c", "n-c"))
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if s.sbs.groups != 1 {
		t.Errorf("%d group transactions, want the 5 writes in 1", s.sbs.groups)
	}
	want := map[string]string{"a": "10.89.0.0/30", "b": "10.89.0.4/30"}
	check := func(s *Store, when string) {
		t.Helper()
		got := map[string]string{}
		if err := s.NetSubnets(ctx, func(id, subnet string) { got[id] = subnet }); err != nil {
			t.Fatal(err)
		}
		all, err := s.ListNets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		table := map[string]string{}
		for id, n := range all {
			table[id] = n.Subnet
		}
		if !maps.Equal(got, want) || !maps.Equal(table, want) {
			t.Fatalf("%s: in memory %v, the table %v; want %v", when, got, table, want)
		}
	}
	check(s, "after the group")
	s.Close()
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	check(s2, "after a reopen")
}
