package main

import (
	"os"
	"testing"
)

// TestClaimLibEnv: the first copy of the library records itself in
// QRPC_LIBRARY; a copy that finds another copy's file mapped in the
// process is told which (qrpc_init then refuses); an entry naming no
// file mapped here (inherited from another process) is replaced.
func TestClaimLibEnv(t *testing.T) {
	if selfID == "" {
		t.Skip("no /proc/self/maps")
	}
	env := func() string { v, _ := cGetenv(libEnv); return v }
	t.Setenv(libEnv, "")
	os.Unsetenv(libEnv)
	if other := claimLibEnv(); other != "" || env() != selfID {
		t.Fatalf("first copy: other %q, %s=%q, want it claimed as %q", other, libEnv, env(), selfID)
	}
	if other := claimLibEnv(); other != "" {
		t.Fatalf("the same copy again: other %q", other)
	}
	// another file mapped here stands for another copy
	another := ""
	eachMapping(func(_, _ uint64, e string) bool {
		if !sameLib(e, selfID) {
			another = e
		}
		return another == ""
	})
	if another == "" {
		t.Skip("no other file mapped")
	}
	os.Setenv(libEnv, another)
	if other := claimLibEnv(); other != another {
		t.Fatalf("another copy's file mapped: other %q, want %q", other, another)
	}
	os.Setenv(libEnv, "00:00 1 /nowhere/libffi_qrpc.so")
	if other := claimLibEnv(); other != "" || env() != selfID {
		t.Fatalf("an entry mapped nowhere here: other %q, %s=%q, want it replaced", other, libEnv, env())
	}
}
