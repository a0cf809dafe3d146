package qrpc

import (
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// setRecvErr asks for ICMP errors on the socket (see udpSocket). An IPv6
// socket gets both options: IPv4-mapped peers are reported by the IPv4 side.
func setRecvErr(uc *net.UDPConn, v6 bool) bool {
	rc, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		if v6 {
			ok = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_RECVERR, 1) == nil
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1)
			return
		}
		ok = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1) == nil
	})
	return ok
}

// drainErrQueue empties the socket's error queue (at most 64 entries a
// turn: ICMP arrives rate-limited, and the next error comes back here).
func (s *udpSocket) drainErrQueue() {
	rc, err := s.SyscallConn()
	if err != nil {
		return
	}
	var buf [256]byte
	var oob [256]byte
	_ = rc.Control(func(fd uintptr) {
		for i := 0; i < 64; i++ {
			_, _, _, _, err := syscall.Recvmsg(int(fd), buf[:], oob[:], syscall.MSG_ERRQUEUE|syscall.MSG_DONTWAIT)
			if err != nil {
				return
			}
		}
	})
}

// rawIO reads and sends with recvmmsg and sendmsg through
// syscall.RawSyscall6. Through Go's syscall package (net, x/net/ipv4) each
// of those calls tells the scheduler it enters a system call, and the
// first one after the runtime was idle wakes Go's sysmon thread, which
// then polls every 20 us for at least a millisecond: the connection's
// goroutines go idle and busy again several times per call, so those
// wake-ups cost more CPU than the I/O (README, Tuning). The socket is
// non-blocking, so the calls never block: EAGAIN waits in the netpoller as
// before.
type rawIO struct {
	rc      syscall.RawConn
	network string
	laddr   net.Addr

	// The callbacks given to rc.Read and rc.Write, made once (a closure
	// per call would allocate), and what they pass back, under rmu / wmu.
	recvFn, sendFn func(fd uintptr) bool
	rcount, rflags int
	noWait         bool // recv: EAGAIN ends the read (readBatchNow)
	rgot           int
	rerr           syscall.Errno
	wsent          int
	werr           syscall.Errno

	rmu   sync.Mutex
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []syscall.RawSockaddrInet6 // room for either family
	last  syscall.RawSockaddrInet6   // the last sender, parsed into lastAddr
	lastN uint32
	lastA *net.UDPAddr

	wmu   sync.Mutex
	whdr  unix.Msghdr
	wiov  unix.Iovec
	wname syscall.RawSockaddrInet6
	wlen  uint32
	waddr *net.UDPAddr // whose sockaddr wname holds
}

type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// newRawIO returns uc's raw I/O, or nil (then net and x/net do it). The
// family is the socket's own (SO_DOMAIN): "udp" on an IPv4 address makes
// an IPv4 socket, on "::" a dual-stack IPv6 one.
func newRawIO(uc *net.UDPConn) *rawIO {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	domain, serr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		domain, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
	}); err != nil || serr != nil {
		return nil
	}
	network := "udp4"
	switch domain {
	case unix.AF_INET:
	case unix.AF_INET6:
		network = "udp6"
	default:
		return nil
	}
	r := &rawIO{rc: rc, network: network, laddr: uc.LocalAddr()}
	r.recvFn, r.sendFn = r.recv, r.send
	return r
}

// rawCall makes a system call on a non-blocking descriptor without telling
// Go's scheduler, again when interrupted; ok == false on EAGAIN (wait in
// the netpoller).
func rawCall(trap, fd, a1, a2, a3 uintptr) (n uintptr, e syscall.Errno, ok bool) {
	for {
		n, _, e = syscall.RawSyscall6(trap, fd, a1, a2, a3, 0, 0)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return 0, e, false
		}
		return n, e, true
	}
}

func (r *rawIO) recv(fd uintptr) bool {
	n, e, ok := rawCall(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(r.rcount), uintptr(r.rflags))
	r.rgot, r.rerr = int(n), e
	return ok || r.noWait
}

func (r *rawIO) send(fd uintptr) bool {
	n, e, ok := rawCall(syscall.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&r.whdr)), 0, 0)
	r.wsent, r.werr = int(n), e
	return ok
}

func (r *rawIO) opError(op string, addr net.Addr, call string, e syscall.Errno) error {
	return &net.OpError{Op: op, Net: r.network, Source: r.laddr, Addr: addr, Err: os.NewSyscallError(call, e)}
}

// readBatch is ipv4.PacketConn.ReadBatch's recvmmsg, for messages of one
// buffer each (quic-go's); ok == false leaves others to the caller.
func (r *rawIO) readBatch(ms []ipv4.Message, flags int) (n int, err error, ok bool) {
	return r.read(ms, flags, false)
}

// readBatchNow is readBatch without waiting: (0, nil, true) when nothing
// is queued.
func (r *rawIO) readBatchNow(ms []ipv4.Message, flags int) (n int, err error, ok bool) {
	return r.read(ms, flags, true)
}

func (r *rawIO) read(ms []ipv4.Message, flags int, noWait bool) (n int, err error, ok bool) {
	for i := range ms {
		if len(ms[i].Buffers) != 1 || len(ms[i].Buffers[0]) == 0 {
			return 0, nil, false
		}
	}
	if len(ms) == 0 {
		return 0, nil, true
	}
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if len(r.hdrs) < len(ms) {
		r.hdrs = make([]mmsghdr, len(ms))
		r.iovs = make([]unix.Iovec, len(ms))
		r.names = make([]syscall.RawSockaddrInet6, len(ms))
	}
	for i := range ms {
		m := &ms[i]
		r.iovs[i].Base = &m.Buffers[0][0]
		r.iovs[i].SetLen(len(m.Buffers[0]))
		h := &r.hdrs[i].hdr
		*h = unix.Msghdr{}
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Namelen = uint32(unsafe.Sizeof(r.names[i]))
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
		if len(m.OOB) > 0 {
			h.Control = &m.OOB[0]
			h.SetControllen(len(m.OOB))
		}
	}
	r.rcount, r.rflags, r.noWait = len(ms), flags, noWait
	if err := r.rc.Read(r.recvFn); err != nil {
		return 0, err, true
	}
	runtime.KeepAlive(ms)
	got, errno := r.rgot, r.rerr
	if errno == syscall.EAGAIN && noWait {
		return 0, nil, true
	}
	if errno != 0 {
		return 0, r.opError("read", nil, "recvmmsg", errno), true
	}
	for i := 0; i < got; i++ {
		m := &ms[i]
		h := &r.hdrs[i].hdr
		m.N = int(r.hdrs[i].n)
		m.NN = int(h.Controllen)
		m.Flags = int(h.Flags)
		m.Addr = r.sender(i, h.Namelen)
	}
	return got, nil, true
}

// sender is message i's source address; the last one is kept, so that a
// connection's packets (all from its server) share one *net.UDPAddr.
func (r *rawIO) sender(i int, n uint32) net.Addr {
	sa := &r.names[i]
	if r.lastA != nil && n == r.lastN && *sa == r.last {
		return r.lastA
	}
	var a *net.UDPAddr
	switch sa.Family {
	case syscall.AF_INET:
		s4 := (*syscall.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		a = &net.UDPAddr{IP: net.IPv4(s4.Addr[0], s4.Addr[1], s4.Addr[2], s4.Addr[3]), Port: int(p[0])<<8 | int(p[1])}
	case syscall.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		ip := make(net.IP, net.IPv6len)
		copy(ip, sa.Addr[:])
		a = &net.UDPAddr{IP: ip, Port: int(p[0])<<8 | int(p[1])}
		if sa.Scope_id != 0 {
			if ifi, err := net.InterfaceByIndex(int(sa.Scope_id)); err == nil {
				a.Zone = ifi.Name
			} else {
				a.Zone = strconv.Itoa(int(sa.Scope_id))
			}
		}
	default:
		return nil
	}
	r.last, r.lastN, r.lastA = *sa, n, a
	return a
}

// writeMsgUDP is net.UDPConn.WriteMsgUDP's sendmsg; ok == false (an
// address with a zone, or of the other family) leaves it to the caller.
func (r *rawIO) writeMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error, ok bool) {
	if addr == nil || addr.Zone != "" {
		return 0, 0, nil, false
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if addr != r.waddr {
		if !r.setName(addr) {
			r.waddr = nil
			return 0, 0, nil, false
		}
		r.waddr = addr
	}
	h := &r.whdr
	*h = unix.Msghdr{}
	h.Name = (*byte)(unsafe.Pointer(&r.wname))
	h.Namelen = r.wlen
	if len(b) > 0 {
		r.wiov.Base = &b[0]
		r.wiov.SetLen(len(b))
		h.Iov = &r.wiov
		h.SetIovlen(1)
	}
	if len(oob) > 0 {
		h.Control = &oob[0]
		h.SetControllen(len(oob))
	}
	if err := r.rc.Write(r.sendFn); err != nil {
		return 0, 0, err, true
	}
	sent, errno := r.wsent, r.werr
	runtime.KeepAlive(b)
	runtime.KeepAlive(oob)
	r.wiov = unix.Iovec{} // no Go pointer kept past the call
	if errno != 0 {
		return 0, 0, r.opError("write", addr, "sendmsg", errno), true
	}
	return sent, len(oob), nil, true
}

// setName puts addr into wname in the socket's family.
func (r *rawIO) setName(addr *net.UDPAddr) bool {
	r.wname = syscall.RawSockaddrInet6{}
	port := (*[2]byte)(unsafe.Pointer(&r.wname.Port))
	if r.network == "udp4" {
		ip4 := addr.IP.To4()
		if ip4 == nil {
			return false
		}
		s4 := (*syscall.RawSockaddrInet4)(unsafe.Pointer(&r.wname))
		s4.Family = syscall.AF_INET
		port = (*[2]byte)(unsafe.Pointer(&s4.Port))
		copy(s4.Addr[:], ip4)
		r.wlen = uint32(unsafe.Sizeof(*s4))
	} else {
		ip := addr.IP.To16()
		if ip == nil {
			return false
		}
		r.wname.Family = syscall.AF_INET6
		copy(r.wname.Addr[:], ip)
		r.wlen = uint32(unsafe.Sizeof(r.wname))
	}
	port[0], port[1] = byte(addr.Port>>8), byte(addr.Port)
	return true
}
