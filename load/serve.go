package load

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferry-edge/ferry/bundle"
)

// The embedded registry's lifetime: one bundle served at a time, under the
// context given to Run.

// Run gives the Loader its lifetime: registries are served until ctx ends.
func (l *Loader) Run(ctx context.Context) error {
	l.mu.Lock()
	l.parent = ctx
	l.mu.Unlock()
	<-ctx.Done()
	l.closeRegistry()
	return nil
}

// addr is the registry's address: the running one's, or the kept one
// (after a restart).
func (l *Loader) addr() (string, error) {
	l.mu.Lock()
	reg := l.reg
	l.mu.Unlock()
	if reg != nil {
		return reg.Addr(), nil
	}
	r, err := l.OpenRegistry()
	if err != nil {
		return "", fmt.Errorf("the embedded registry's address: %w", err)
	}
	defer r.Close()
	return r.Addr(), nil
}

// serve starts the registry over dir unless it serves it already.
func (l *Loader) serve(dir string) (BundleServer, error) {
	l.mu.Lock()
	if l.reg != nil && l.dir == dir {
		select {
		case <-l.stopped: // it stopped: start again below
		default:
			reg := l.reg
			l.mu.Unlock()
			return reg, nil
		}
	}
	parent := l.parent
	l.mu.Unlock()
	if parent == nil {
		return nil, fmt.Errorf("the embedded registry cannot start: load.Loader.Run was not started")
	}
	l.closeRegistry()
	if fi, err := os.Stat(filepath.Join(dir, bundle.RegistryRoot)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s has no %s: extract the bundle again", bundle.ErrInvalid, dir, bundle.RegistryRoot)
	}
	reg, err := l.OpenRegistry()
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(parent)
	stopped := make(chan struct{})
	l.mu.Lock()
	l.reg, l.dir, l.stop, l.stopped = reg, dir, stop, stopped
	l.mu.Unlock()
	go func() {
		defer close(stopped)
		if err := reg.Serve(ctx, dir); err != nil && l.Log != nil {
			l.Log.Error("embedded registry stopped", "err", err)
		}
	}()
	return reg, nil
}

// closeRegistry stops the registry and waits for it.
func (l *Loader) closeRegistry() {
	l.mu.Lock()
	reg, stop, stopped := l.reg, l.stop, l.stopped
	l.reg, l.dir, l.stop, l.stopped = nil, "", nil, nil
	l.mu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	if reg != nil {
		reg.Close()
	}
}
