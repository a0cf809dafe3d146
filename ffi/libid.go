package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"unsafe"
)

// libEnv names, in the process's environment (libc's, which every Lua VM
// of the worker reads), the file of the library the process loaded first,
// as /proc/self/maps writes it, after the process that loaded it (its pid
// and start time): "<pid> <start> <major:minor> <inode> <path>". Each
// copy of the library is a Go runtime of its own, and a worker must run
// one: the loader (lua/resty/ffi/qrpc/loader.lua) reads this before it
// loads anything, so that a second Lua VM (the other subsystem) loads the
// same file or is refused. A process started by a worker inherits the
// variable: the process fields tell it that the entry is not its own,
// where the device and inode cannot (btrfs subvolumes show one device,
// and each numbers its first file 257). The start time, because a pid is
// given again once its process is gone, and starts from 1 in a pid
// namespace.
const libEnv = "QRPC_LIBRARY"

// selfID is this copy's file, in libEnv's form ("" when /proc/self/maps
// does not show it).
var selfID = findSelf()

func findSelf() string {
	addr := uint64(reflect.ValueOf(findSelf).Pointer())
	id := ""
	eachMapping(func(lo, hi uint64, entry string) bool {
		if addr >= lo && addr < hi {
			id = entry
			return false
		}
		return true
	})
	return id
}

// eachMapping calls f with each file mapping of the process, as an
// entry of libEnv's form, until f returns false.
func eachMapping(f func(lo, hi uint64, entry string) bool) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return
	}
	// split on newlines only (bufio.ScanLines would drop a path's final
	// \r); the kernel writes a newline of a path as \012
	for _, line := range strings.Split(string(maps), "\n") {
		// start-end perms offset dev inode path; the path as it is,
		// spaces and tabs included
		fs := strings.Fields(line)
		if len(fs) < 6 || fs[4] == "0" {
			continue
		}
		path := rawPath(line)
		l, h, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		lo, err1 := strconv.ParseUint(l, 16, 64)
		hi, err2 := strconv.ParseUint(h, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if !f(lo, hi, fs[3]+" "+fs[4]+" "+path) {
			return
		}
	}
}

// rawPath is the path of a /proc/self/maps line: what follows its fifth
// field and the spaces after it.
func rawPath(line string) string {
	s := line
	for i := 0; i < 5; i++ {
		s = strings.TrimLeft(s, " ")
		if j := strings.IndexByte(s, ' '); j >= 0 {
			s = s[j:]
		} else {
			return ""
		}
	}
	return strings.TrimLeft(s, " ")
}

// mapped: the file of a libEnv entry is mapped in this process, under
// any name: replaced since (" (deleted)"), or renamed (a backup made with
// mv keeps the mapping under its new name). An entry inherited from
// another process names none.
func mapped(entry string) bool {
	found := false
	eachMapping(func(_, _ uint64, e string) bool {
		found = sameFile(e, entry)
		return !found
	})
	return found
}

// sameFile: two entries name one device and inode.
func sameFile(a, b string) bool {
	fa, fb := strings.SplitN(a, " ", 3), strings.SplitN(b, " ", 3)
	return len(fa) == 3 && len(fb) == 3 && fa[0] == fb[0] && fa[1] == fb[1]
}

// claimLibEnv records this copy in libEnv unless a copy did first; it
// returns the other copy's entry when one did (and is not this one).
func claimLibEnv() (other string) {
	if selfID == "" {
		return ""
	}
	name := C.CString(libEnv)
	defer C.free(unsafe.Pointer(name))
	if cur, ok := cGetenv(libEnv); ok {
		if entry, own := ownEntry(cur); own {
			if sameLib(entry, selfID) {
				return ""
			}
			if mapped(entry) {
				return entry
			}
		}
	}
	val := C.CString(selfProc() + " " + selfID)
	defer C.free(unsafe.Pointer(val))
	C.setenv(name, val, 1)
	return ""
}

// ownEntry is the entry of a libEnv value that this process recorded
// (own), without its process fields. A value of another process was
// inherited: it names no copy of this process, whatever file shows its
// device and inode here. A value without them (a release before they
// were recorded) is taken as this process's, as that release takes it.
func ownEntry(v string) (entry string, own bool) {
	pid, rest, ok := strings.Cut(v, " ")
	if !ok {
		return "", false
	}
	if strings.Contains(pid, ":") {
		return v, true
	}
	start, rest, ok := strings.Cut(rest, " ")
	if !ok {
		return "", false
	}
	return rest, pid+" "+start == selfProc()
}

// selfProc is this process in libEnv's form: "<pid> <start time>", the
// start time in clock ticks since boot, as /proc/self/stat's 22nd field
// gives it ("0" when it cannot be read).
func selfProc() string {
	start := "0"
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		// the command name, in parentheses, may hold spaces and ")"
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if fs := strings.Fields(string(b[i+1:])); len(fs) > 19 {
				start = fs[19]
			}
		}
	}
	return strconv.Itoa(os.Getpid()) + " " + start
}

// cGetenv reads libc's environment, where another copy of the library
// (another Go runtime) writes, unlike Go's copy that os.Getenv reads.
func cGetenv(key string) (string, bool) {
	k := C.CString(key)
	defer C.free(unsafe.Pointer(k))
	v := C.getenv(k)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// sameLib: two libEnv entries name one mapped file. The path counts
// too: the dynamic linker maps a file once, under one path, while two
// files may show one device and inode in /proc/self/maps (btrfs
// subvolumes, each with its own inode 257, on one device there).
func sameLib(a, b string) bool { return a == b }

// otherCopyErr is qrpc_init's refusal in a second copy.
func otherCopyErr(other string) error {
	path := other
	if fs := strings.SplitN(other, " ", 3); len(fs) == 3 {
		path = fs[2]
	}
	return fmt.Errorf("qrpc: another copy of the library runs in this process (%s): one Go runtime per worker; load the same file everywhere", path)
}
