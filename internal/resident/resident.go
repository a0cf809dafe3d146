// Package resident gives back an idle worker's mappings of the library's
// read-only pages.
//
// The library is large (code, read-only data and tables of some 13 MB),
// and the kernel maps its file pages around each page a process touches
// (at least 64 KB, or the page-cache folio: about 300 KB for a file
// written by the Go linker), so that loading it and one call leave nearly
// all of it resident in every worker: it counts in each worker's RSS,
// though the pages exist once in the page cache. Once a worker has been
// idle for a while, Release drops its mappings of those pages
// (madvise MADV_DONTNEED): the pages stay in the page cache, and the
// next call maps back the ones it touches, as minor faults.
//
// Only mappings of the library's file that are not writable and hold no
// private (copied-on-write) page are dropped: their pages are the file's,
// so dropping them loses nothing, as when the kernel reclaims them under
// memory pressure, which it may do at any time. The relocated read-only
// data (RELRO) and the writable data hold private pages and are kept.
package resident

import (
	"bufio"
	"bytes"
	"fmt"
	"reflect"
	"strconv"
	"syscall"
	"unsafe"
)

// mapping is one line of /proc/self/smaps with the fields Release needs.
type mapping struct {
	start, end uintptr
	perms      string
	dev, inode string
	path       string
	rss, anon  int64 // kB
}

// parseSmaps reads the mappings of an smaps file.
func parseSmaps(b []byte) ([]mapping, error) {
	var ms []mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if i := bytes.IndexByte(f[0], '-'); i > 0 && len(f) >= 5 && !bytes.HasSuffix(f[0], []byte(":")) {
			lo, err1 := strconv.ParseUint(string(f[0][:i]), 16, 64)
			hi, err2 := strconv.ParseUint(string(f[0][i+1:]), 16, 64)
			if err1 != nil || err2 != nil || hi < lo {
				return nil, fmt.Errorf("smaps: bad range %q", f[0])
			}
			m := mapping{start: uintptr(lo), end: uintptr(hi), perms: string(f[1]),
				dev: string(f[3]), inode: string(f[4])}
			if len(f) >= 6 {
				m.path = string(bytes.Join(f[5:], []byte(" ")))
			}
			ms = append(ms, m)
			continue
		}
		if len(ms) == 0 || len(f) < 2 {
			continue
		}
		var dst *int64
		switch string(f[0]) {
		case "Rss:":
			dst = &ms[len(ms)-1].rss
		case "Anonymous:":
			dst = &ms[len(ms)-1].anon
		default:
			continue
		}
		n, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("smaps: bad %s %q", f[0], f[1])
		}
		*dst = n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("smaps: %w", err)
	}
	return ms, nil
}

// droppable picks the mappings of the file that holds pc which Release
// may drop: not writable, private pages none, something resident.
func droppable(ms []mapping, pc uintptr) []mapping {
	var own *mapping
	for i := range ms {
		if ms[i].start <= pc && pc < ms[i].end {
			own = &ms[i]
			break
		}
	}
	if own == nil || own.inode == "0" || own.path == "" {
		return nil
	}
	var out []mapping
	for _, m := range ms {
		if m.dev != own.dev || m.inode != own.inode || m.path != own.path {
			continue
		}
		if len(m.perms) < 4 || m.perms[1] != '-' || m.perms[3] != 'p' || m.anon != 0 || m.rss == 0 {
			continue
		}
		out = append(out, m)
	}
	return out
}

// self is the address of a function of this package: its code is in the
// library's text.
var self = reflect.ValueOf(parseSmaps).Pointer()

// readRaw reads a file with raw system calls: the runtime does not see
// them, so an idle runtime's P is not handed to another thread (which it
// would start) while the kernel writes out smaps, a millisecond or so.
func readRaw(path string) ([]byte, error) {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return nil, err
	}
	fd, _, errno := syscall.RawSyscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(p)),
		syscall.O_RDONLY|syscall.O_CLOEXEC, 0, 0, 0)
	if errno != 0 {
		return nil, errno
	}
	defer syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
	b := make([]byte, 0, 256<<10)
	for {
		if len(b) == cap(b) {
			if cap(b) >= maxSmaps {
				return nil, fmt.Errorf("over %d bytes", maxSmaps)
			}
			b = append(b, 0)[:len(b)]
		}
		free := b[len(b):cap(b)]
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&free[0])), uintptr(len(free)))
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			return nil, errno
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+int(n)]
	}
}

const (
	atFDCWD = ^uintptr(99) // AT_FDCWD, -100
	// maxSmaps bounds what readRaw reads: an nginx worker's smaps is
	// some 100 kB.
	maxSmaps = 64 << 20
)

// Release drops this process's mappings of the read-only pages of the file
// its code is in (the library; the program itself in tests), and returns
// how many kB were resident in them.
func Release() (int64, error) {
	b, err := readRaw("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("resident: read /proc/self/smaps: %w", err)
	}
	ms, err := parseSmaps(b)
	if err != nil {
		return 0, fmt.Errorf("resident: %w", err)
	}
	var kb int64
	for _, m := range droppable(ms, self) {
		_, _, errno := syscall.RawSyscall(syscall.SYS_MADVISE, m.start, m.end-m.start, syscall.MADV_DONTNEED)
		if errno != 0 {
			return kb, fmt.Errorf("resident: madvise %x-%x: %w", m.start, m.end, errno)
		}
		kb += m.rss
	}
	return kb, nil
}
