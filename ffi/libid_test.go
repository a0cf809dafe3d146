package main

import (
	"fmt"
	"os"
	"strings"
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
	own := selfProc() + " " + selfID
	if other := claimLibEnv(); other != "" || env() != own {
		t.Fatalf("first copy: other %q, %s=%q, want it claimed as %q", other, libEnv, env(), own)
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
	os.Setenv(libEnv, selfProc()+" "+another)
	if other := claimLibEnv(); other != another {
		t.Fatalf("another copy's file mapped: other %q, want %q", other, another)
	}
	// an older release's entry has no pid: taken as this process's
	os.Setenv(libEnv, another)
	if other := claimLibEnv(); other != another {
		t.Fatalf("another copy's file mapped, no pid: other %q, want %q", other, another)
	}
	os.Setenv(libEnv, selfProc()+" 00:00 1 /nowhere/libffi_qrpc.so")
	if other := claimLibEnv(); other != "" || env() != own {
		t.Fatalf("an entry mapped nowhere here: other %q, %s=%q, want it replaced", other, libEnv, env())
	}
	// Inherited from the worker that started this process: another pid.
	// On btrfs another file can show this copy's device and inode (each
	// subvolume numbers its first file 257 on one device): another path
	// with them stands for it.
	dev, ino, _ := strings.Cut(selfID, " ")
	ino, _, _ = strings.Cut(ino, " ")
	pid, start, _ := strings.Cut(selfProc(), " ")
	for _, proc := range []string{
		fmt.Sprint(os.Getpid()+1) + " " + start, // another process
		pid + " 1" + start,                      // this pid, given again
	} {
		os.Setenv(libEnv, proc+" "+dev+" "+ino+" /elsewhere/libffi_qrpc.so")
		if other := claimLibEnv(); other != "" || env() != own {
			t.Fatalf("an inherited entry (%s) with this copy's device and inode: other %q, %s=%q, want it replaced", proc, other, libEnv, env())
		}
	}
	if start == "0" {
		t.Errorf("selfProc() = %q: no start time", selfProc())
	}
}
