package localapi

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

type fdConnKey struct{}

// fdListener hands out connections that keep the descriptors a client
// sends with its request.
type fdListener struct{ *net.UnixListener }

func (l fdListener) Accept() (net.Conn, error) {
	c, err := l.AcceptUnix()
	if err != nil {
		return nil, err
	}
	fc := &fdConn{UnixConn: c}
	fc.cred, fc.credErr = peerCred(c)
	return fc, nil
}

// peerCred is who connected (SO_PEERCRED): the process's credentials
// when it called connect, which the kernel records and the caller cannot
// forge.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, credErr
}

// fromRoot refuses (ErrNotRoot) a connection whose peer is not root. The
// socket's mode (0600, root's) already keeps others out; this holds even
// if the mode is changed, or the socket is reached another way.
func (c *fdConn) fromRoot() error {
	if c.credErr != nil || c.cred == nil {
		return fmt.Errorf("%w: cannot tell who connected (SO_PEERCRED: %v)", ErrNotRoot, c.credErr)
	}
	if c.cred.Uid != 0 {
		return fmt.Errorf("%w: refused uid %d (gid %d, pid %d): run ferry load as root", ErrNotRoot, c.cred.Uid, c.cred.Gid, c.cred.Pid)
	}
	return nil
}

// fdConn reads with recvmsg so that descriptors sent with the request's
// bytes are kept (a plain read would close them), at most maxPassed.
type fdConn struct {
	*net.UnixConn
	cred    *unix.Ucred // the peer, from SO_PEERCRED at accept
	credErr error
	oob     []byte // room for maxPassed descriptors
	mu      sync.Mutex
	files   []*os.File
}

func (c *fdConn) Read(b []byte) (int, error) {
	if c.oob == nil {
		c.oob = make([]byte, unix.CmsgSpace(maxPassed*4))
	}
	n, oobn, _, _, err := c.ReadMsgUnix(b, c.oob)
	if oobn > 0 {
		c.keep(c.oob[:oobn])
	}
	switch {
	case n < 0:
		n = 0
	case n == 0 && err == nil && len(b) > 0:
		err = io.EOF // recvmsg's 0 on a stream: the peer closed
	}
	return n, err
}

func (c *fdConn) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if len(c.files) < maxPassed {
				c.files = append(c.files, os.NewFile(uintptr(fd), "passed"))
			} else {
				unix.Close(fd)
			}
		}
	}
}

func (c *fdConn) take() []*os.File {
	c.mu.Lock()
	defer c.mu.Unlock()
	fs := c.files
	c.files = nil
	return fs
}

func (c *fdConn) Close() error {
	for _, f := range c.take() {
		f.Close()
	}
	return c.UnixConn.Close()
}
