package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPort_TwoTestsNeverShareAPortAndTheKernelWouldNotHandItOut: ports
// handed out in one test are distinct, bindable and below the ephemeral
// range; a port still reserved is not handed out again.
func TestPort_TwoTestsNeverShareAPortAndTheKernelWouldNotHandItOut(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 200; i++ {
		p := Port(t, "127.0.0.1")
		if p < low || p > high {
			t.Fatalf("port %d outside %d–%d", p, low, high)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice while reserved", p)
		}
		seen[p] = true
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t, "127.0.0.1"))))
	if err != nil {
		t.Fatalf("a reserved port cannot be bound: %v", err)
	}
	l.Close()
}
