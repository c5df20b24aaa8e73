// Package freeport hands tests TCP ports that another process is told to
// listen on later: an agent's peer address, an API server's port.
//
// Asking the kernel for port 0 and closing the socket is not enough: the
// kernel hands the same ephemeral range to every connect and every
// listen on :0, so under a busy CI machine another test's dial or server
// takes the port before the agent binds it (CI saw "bind: address
// already in use"). Ports here come from below the ephemeral range, and
// each is held by an flock on a file shared by every test process until
// the test ends, so two tests never pick the same one; the kernel drops
// the lock when a killed process dies.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// The range sits below Linux's default ephemeral range (32768–60999), so
// no dial and no :0 listener is ever given one of these ports.
const (
	low  = 20000
	high = 32767
)

// Port is a TCP port free on ip, reserved for t's lifetime.
func Port(t testing.TB, ip string) int {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "ferry-test-ports")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := low + rand.IntN(high-low)
	for i := 0; i <= high-low; i++ {
		port := low + (start-low+i)%(high-low+1)
		if f := reserve(dir, ip, port); f != nil {
			t.Cleanup(func() { f.Close() })
			return port
		}
	}
	t.Fatalf("freeport: no free port on %s in %d–%d", ip, low, high)
	return 0
}

// Addr is a free "127.0.0.1:port", reserved for t's lifetime.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t, "127.0.0.1")))
}

// reserve locks port's file and checks the port can be bound now; nil
// when another test holds it or something listens on it.
func reserve(dir, ip string, port int) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(port)), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		f.Close()
		return nil
	}
	l.Close()
	return f
}
