//go:build !linux

package qrpc

import "net"

// setRecvErr: only Linux is supported (and tested); elsewhere quic-go's
// own handling applies (a closed port is seen as a timeout).
func setRecvErr(*net.UDPConn, bool) bool { return false }

func (s *udpSocket) drainErrQueue() {}
