package crio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/registry"
)

// BundleLoader loads extracted bundles: it serves the bundle's directory
// from the embedded registry, which stays up until Cleanup (so that pulls
// during the cluster upgrade are served locally), and runs the Loader. It
// has the agent's Loader methods.
type BundleLoader struct {
	Loader *Loader
	// RegistryStateDir keeps the registry's certificate and port.
	RegistryStateDir string
	// RegistryPort is the configured port; 0 keeps the one chosen at
	// first start.
	RegistryPort int
	Log          *slog.Logger

	mu     sync.Mutex
	reg    *registry.Registry
	dir    string
	cancel context.CancelFunc
	done   chan struct{}
}

// Load serves dir (an extracted bundle: metadata.json and
// docker/registry/v2) and loads meta's images, pinned. Calling it again
// for the same bundle (after a restart) is cheap: unchanged drop-ins are
// not rewritten and present, pinned images are skipped.
func (b *BundleLoader) Load(ctx context.Context, meta *bundle.Metadata, dir string, keep []string, progress func(done, total int)) error {
	reg, err := b.serve(dir)
	if err != nil {
		return err
	}
	_, err = b.Loader.Load(ctx, Request{
		Images: meta.AllImages(), Keep: bundle.PullRefs(keep), Addr: reg.Addr(), CACert: reg.CACertPEM(),
		Label: meta.DirName(), Progress: progress,
	})
	return err
}

// Retire ends a bundle whose upgrade is done: its mirror and CA go and
// the registry stops if it serves dir; its pins stay.
func (b *BundleLoader) Retire(ctx context.Context, meta *bundle.Metadata, dir string) error {
	addr, err := b.addr()
	if err != nil {
		return err
	}
	if err := b.Loader.Retire(ctx, Request{Images: meta.AllImages(), Addr: addr, Label: meta.DirName()}); err != nil {
		return err
	}
	b.mu.Lock()
	serving := b.dir == dir
	b.mu.Unlock()
	if serving {
		b.Close()
	}
	return nil
}

// Unpin drops the pins of images (an earlier bundle's).
func (b *BundleLoader) Unpin(ctx context.Context, images []string) error {
	return b.Loader.Unpin(ctx, Request{Images: images, Label: "previous bundle"})
}

// Cleanup unpins meta's images (keeping pins other drop-ins hold),
// removes the mirror and CA, reloads CRI-O and stops the registry if it
// serves dir. It does not remove dir.
func (b *BundleLoader) Cleanup(ctx context.Context, meta *bundle.Metadata, dir string) error {
	addr, err := b.addr()
	if err != nil {
		return err
	}
	if err := b.Loader.Unload(ctx, Request{Images: meta.AllImages(), Addr: addr, Label: meta.DirName()}); err != nil {
		return err
	}
	b.mu.Lock()
	serving := b.dir == dir
	b.mu.Unlock()
	if serving {
		b.Close()
	}
	return nil
}

// Close stops the registry.
func (b *BundleLoader) Close() error {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.reg, b.dir, b.cancel, b.done = nil, "", nil, nil
	b.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// addr is the registry's address, from the running one or the state
// kept on disk (Cleanup after a restart).
func (b *BundleLoader) addr() (string, error) {
	b.mu.Lock()
	reg := b.reg
	b.mu.Unlock()
	if reg != nil {
		return reg.Addr(), nil
	}
	r, err := registry.New(b.RegistryStateDir, b.RegistryPort, b.Log)
	if errors.Is(err, registry.ErrPortInUse) {
		// Someone holds the port; the address is still the kept one.
		return "", fmt.Errorf("cleanup: %w", err)
	}
	if err != nil {
		return "", err
	}
	defer r.Close()
	return r.Addr(), nil
}

// serve starts the registry over dir unless it already serves it.
func (b *BundleLoader) serve(dir string) (*registry.Registry, error) {
	b.mu.Lock()
	if b.reg != nil && b.dir == dir {
		select {
		case <-b.done:
			// it stopped; start again below
		default:
			reg := b.reg
			b.mu.Unlock()
			return reg, nil
		}
	}
	b.mu.Unlock()
	b.Close()

	if fi, err := os.Stat(filepath.Join(dir, bundle.RegistryRoot)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s has no %s: extract the bundle again", registry.ErrNotBundle, dir, bundle.RegistryRoot)
	}
	reg, err := registry.New(b.RegistryStateDir, b.RegistryPort, b.Log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	b.mu.Lock()
	b.reg, b.dir, b.cancel, b.done = reg, dir, cancel, done
	b.mu.Unlock()
	go func() {
		defer close(done)
		if err := reg.Serve(ctx, dir); err != nil {
			if b.Log != nil {
				b.Log.Error("embedded registry stopped", "err", err)
			}
		}
	}()
	return reg, nil
}
