package hostq

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/bridge"
	"github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc/internal/safego"
)

// acceptTimeout bounds how long a wake socket waits for its dispatcher:
// past it the file is removed so that a dispatcher that died before
// connecting leaves nothing on disk.
const acceptTimeout = 30 * time.Second

// maxSunPath is the room for a path in sockaddr_un (108 bytes with the NUL).
const maxSunPath = 107

// wakeState owns the built-in host's wake-up socket: a listener waiting for
// the dispatcher, then the one accepted connection that wake bytes go to.
type wakeState struct {
	mu   sync.Mutex
	ln   *net.UnixListener // waiting for a dispatcher, or nil
	path string            // ln's file
	conn atomic.Pointer[wakeConn]
}

type wakeConn struct {
	c   *net.UnixConn
	raw syscall.RawConn
}

var wakeByte = []byte{1}

// wakeSeq numbers the socket files of this process, all VMs' (each VM has
// its own wakeState, and two files must never share a name).
var wakeSeq atomic.Int64

// signal writes one wake byte. It never blocks and never raises SIGPIPE:
// a full socket buffer means a byte is already waiting to be read, and a
// closed peer means the dispatcher is gone (it reopens the socket).
func (w *wakeState) signal() {
	wc := w.conn.Load()
	if wc == nil {
		return
	}
	// A raw send: through Go's syscall package it would wake Go's sysmon
	// when the runtime was idle (see hostq.c).
	_ = wc.raw.Write(func(fd uintptr) bool {
		for {
			_, _, e := syscall.RawSyscall6(syscall.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&wakeByte[0])), 1,
				syscall.MSG_DONTWAIT|syscall.MSG_NOSIGNAL, 0, 0)
			if e != syscall.EINTR {
				return true
			}
		}
	})
}

// open creates a new socket file in dir and starts waiting for one
// connection. It replaces a listener still waiting; the current connection
// stays in use until the new one is accepted.
// room is the caller's buffer for the path (NUL included); everything is
// checked before the current listener is touched.
func (w *wakeState) open(dir string, room int, onConnect func()) (string, error) {
	if dir == "" {
		return "", errors.New("wake socket: empty directory")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	path := filepath.Join(dir, fmt.Sprintf("qrpc-%d-%d.sock", os.Getpid(), wakeSeq.Add(1)))
	if len(path) > maxSunPath {
		return "", fmt.Errorf("wake socket: path %q is %d bytes, a unix socket path has room for %d", path, len(path), maxSunPath)
	}
	if len(path)+1 > room {
		return "", fmt.Errorf("%w: path buffer of %d bytes, need %d", bridge.ErrBadCommand, room, len(path)+1)
	}
	// A file of that name can only be left over from a crashed process
	// that had our pid; binding would fail on it.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("wake socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return "", fmt.Errorf("wake socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // we unlink ourselves, as soon as the dispatcher is in
	// The worker creates the file, so it owns it; nobody else needs it.
	// Between bind and chmod the umask applies: accept() therefore also
	// checks that the peer is this process.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		_ = os.Remove(path)
		return "", fmt.Errorf("wake socket: %w", err)
	}
	w.dropListenerLocked()
	w.ln, w.path = ln, path
	safego.Go("wake accept", func() { w.accept(ln, path, onConnect) }, nil)
	return path, nil
}

func (w *wakeState) dropListenerLocked() {
	if w.ln != nil {
		_ = w.ln.Close()
		_ = os.Remove(w.path)
		w.ln, w.path = nil, ""
	}
}

func (w *wakeState) accept(ln *net.UnixListener, path string, onConnect func()) {
	_ = ln.SetDeadline(time.Now().Add(acceptTimeout))
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			w.mu.Lock()
			mine := w.ln == ln
			if mine {
				w.dropListenerLocked()
			}
			w.mu.Unlock()
			if mine {
				rt.Logger().Warn("qrpc wake socket: no dispatcher connected", "path", path, "err", err)
			}
			return
		}
		if pid, err := peerPID(c); err != nil || pid != os.Getpid() {
			rt.Logger().Warn("qrpc wake socket: refused a connection from another process", "path", path, "pid", pid)
			_ = c.Close()
			continue
		}
		raw, err := c.SyscallConn()
		if err != nil {
			_ = c.Close()
			continue
		}
		w.mu.Lock()
		if w.ln != ln { // replaced by a newer open, or closed
			w.mu.Unlock()
			_ = c.Close()
			return
		}
		w.dropListenerLocked()
		old := w.conn.Swap(&wakeConn{c: c, raw: raw})
		w.mu.Unlock()
		if old != nil {
			_ = old.c.Close()
		}
		// Completions pushed before the swap woke nobody.
		onConnect()
		return
	}
}

func peerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// close drops the listener (and its file) and the connection.
func (w *wakeState) close() {
	w.mu.Lock()
	w.dropListenerLocked()
	old := w.conn.Swap(nil)
	w.mu.Unlock()
	if old != nil {
		_ = old.c.Close()
	}
}
