package kubeenv

import (
	"os"
	"slices"
	"testing"
)

// A pair started outside any test: what its start registered is cleaned
// up last first, as testing does, and a fatal error ends the starting
// goroutine with its message (the test that takes it starts another).
func TestBootT_CleansUpLastFirstAndStopsAtAFatalError(t *testing.T) {
	b := &bootT{}
	var order []int
	done := make(chan string)
	var dir string
	go func() {
		defer func() { done <- b.failed }()
		dir = b.TempDir()
		b.Cleanup(func() { order = append(order, 1) })
		b.Cleanup(func() { order = append(order, 2) })
		b.Fatalf("no %s", "etcd")
		order = append(order, 99) // not reached
	}()
	if msg := <-done; msg != "no etcd" {
		t.Fatalf("failed = %q, want the fatal message", msg)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the temporary directory is gone before its cleanup: %v", err)
	}
	b.cleanup()
	if !slices.Equal(order, []int{2, 1}) {
		t.Errorf("cleanups ran as %v, want [2 1]", order)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the temporary directory %s is left: %v", dir, err)
	}
	b.cleanup() // a second call has nothing left to run
	if len(order) != 2 {
		t.Errorf("cleanups ran again: %v", order)
	}
}
