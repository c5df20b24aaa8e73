package kubeenv

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// Main runs a package's tests with each test's etcd and kube-apiserver
// started while the test before it runs: every test still has a pair of
// its own, fresh, but not the 7 s its start takes on two cores (most of
// test/kube's time otherwise). Call it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(kubeenv.Main(m)) }
func Main(m *testing.M) int {
	pool.mu.Lock()
	pool.on = true
	pool.mu.Unlock()
	code := m.Run()
	pool.drain()
	return code
}

// pool holds the pair started for the next test.
var pool warmer

type warmer struct {
	mu   sync.Mutex
	on   bool         // Main runs the tests
	next chan *booted // the next test's pair, being started; nil: none
	bin  string       // what next was started from
}

// booted is a pair started outside any test, and what its start left to
// clean up.
type booted struct {
	e *Env // nil: the start failed
	t *bootT
}

// take hands t the pair started for it (or starts one now), and starts
// the next test's.
func (w *warmer) take(t testing.TB, bin string) *Env {
	t.Helper()
	w.mu.Lock()
	next, on := w.next, w.on
	if w.bin != bin {
		next = nil // another cache: not what this test asked for
	}
	w.next = nil
	w.mu.Unlock()

	var e *Env
	if next != nil {
		b := <-next
		t.Cleanup(b.t.cleanup)
		if b.e == nil {
			t.Logf("kubeenv: the API server started for this test failed (%s); starting another", b.t.failed)
		} else {
			e = b.e
			e.t = t
		}
	}
	if e == nil {
		e = boot(t, bin)
	}
	if on {
		w.mu.Lock()
		w.next, w.bin = w.start(bin), bin
		w.mu.Unlock()
	}
	return e
}

// start boots a pair in the background.
func (w *warmer) start(bin string) chan *booted {
	ch := make(chan *booted, 1)
	go func() {
		b := &booted{t: &bootT{}}
		defer func() { ch <- b }() // also after bootT's Fatal (Goexit)
		b.e = boot(b.t, bin)
	}()
	return ch
}

// drain stops the pair no test took.
func (w *warmer) drain() {
	w.mu.Lock()
	next := w.next
	w.next, w.on = nil, false
	w.mu.Unlock()
	if next != nil {
		(<-next).t.cleanup()
	}
}

// bootT is the testing.TB of a pair started outside any test: it keeps
// what boot's helpers register to clean up, and turns a fatal error into
// the end of the starting goroutine. Only the methods those helpers call
// are here; another would panic on the nil TB.
type bootT struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   string
}

func (b *bootT) Helper()             {}
func (b *bootT) Logf(string, ...any) {}

func (b *bootT) Cleanup(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups = append(b.cleanups, f)
}

func (b *bootT) TempDir() string {
	dir, err := os.MkdirTemp("", "kubeenv-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (b *bootT) Fatal(args ...any) { b.fail(fmt.Sprint(args...)) }

func (b *bootT) Fatalf(format string, args ...any) { b.fail(fmt.Sprintf(format, args...)) }

func (b *bootT) fail(msg string) {
	b.failed = msg
	runtime.Goexit()
}

// cleanup runs what was registered, the last first, as testing does.
func (b *bootT) cleanup() {
	b.mu.Lock()
	fs := slices.Clone(b.cleanups)
	b.cleanups = nil
	b.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}
