// Package load puts an extracted bundle into CRI-O: it serves the bundle's
// tree with the embedded registry, asks CRI-O to pull and pin its images
// through it, and checks first that the image store has room. It is the
// agent's Loader (agent.Loader), wired in cmd/ferry. The registry, CRI-O
// and its image store each stay behind a narrow seam (BundleServer,
// Runtime, Store); the one piece that knows bundles is this one.
package load

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
)

// BundleServer serves one extracted bundle on loopback (registry.Registry).
type BundleServer interface {
	// Serve serves the tree under root until ctx ends or Close.
	Serve(ctx context.Context, root string) error
	Addr() string
	CACertPEM() []byte
	Close() error
}

// Runtime is CRI-O as loading needs it (crio.Runtime): it takes image
// references and a registry address, and no bundle conventions.
type Runtime interface {
	// Load writes the drop-ins (mirror to r.Addr, pins), reloads, pulls
	// and pins every reference.
	Load(ctx context.Context, r crio.Request) (crio.Result, error)
	// Unload removes pins, mirror and CA.
	Unload(ctx context.Context, r crio.Request) error
	// Retire removes the mirror and CA; the pins stay.
	Retire(ctx context.Context, r crio.Request) error
	// Unpin drops the pins of r.Pull.
	Unpin(ctx context.Context, r crio.Request) error
	// Present tells which of refs the runtime holds.
	Present(ctx context.Context, refs []string) (map[string]bool, error)
}

var _ Runtime = (*crio.Runtime)(nil)

// RequestFor is what CRI-O is asked for images (a bundle's, as
// metadata.json names them: name[:tag]@sha256:…, in the order to pull
// them): each pulled and pinned by digest and, when it kept its tag, by
// tag too (bundle.PullRefs), each repository mirrored at the path the
// bundle stores it under (bundle.RepoPaths), which is where the embedded
// registry serves it. The caller adds the registry and the label.
func RequestFor(images []string) crio.Request {
	return crio.Request{Pull: bundle.PullRefs(images), Mirrors: bundle.RepoPaths(images)}
}

// Loader is the agent's Loader on a BundleServer, a Runtime and the
// runtime's image Store. Its registry runs under the context given to
// Run, which the caller runs with its other servers: nothing of it
// outlives the agent.
type Loader struct {
	// OpenRegistry binds the registry (its port and certificate are kept
	// across restarts).
	OpenRegistry func() (BundleServer, error)
	Runtime      Runtime
	// Store is where the runtime keeps images: its room is checked before
	// a bundle is written and again before it is loaded (ImageStore).
	Store Store
	// RoomFloor is kept free in the image store beyond what a load writes.
	RoomFloor int64
	Log       *slog.Logger

	mu      sync.Mutex
	parent  context.Context
	reg     BundleServer
	dir     string
	stop    context.CancelFunc
	stopped chan struct{}
}

// Load serves dir and loads images (meta's, a tag perhaps dropped:
// Record.Images), pinned; keep are the previous bundle's pins. Calling it
// again for the same bundle is cheap.
func (l *Loader) Load(ctx context.Context, meta *bundle.Metadata, images []string, dir string, keep []string, progress func(done, total int)) error {
	blobs, err := bundle.ImageBlobs(dir, images, bundle.GoArch(meta.Arch))
	if err != nil {
		return fmt.Errorf("%w: the extracted bundle in %s is damaged (%v): run 'ferry cleanup' and give the bundle again", bundle.ErrInvalid, dir, err)
	}
	if err := l.checkLoadRoom(ctx, blobs); err != nil {
		return err
	}
	return l.load(ctx, meta, dir, keep, progress, biggestFirst(images, blobs))
}

// biggestFirst orders images by their bytes, largest first: pulled in that
// order, a few big images do not run alone at the end while the other
// workers idle.
func biggestFirst(images []string, blobs map[string]map[string]int64) []string {
	size := make(map[string]int64, len(images))
	for _, ref := range images {
		for _, n := range blobs[ref] {
			size[ref] += n
		}
	}
	out := slices.Clone(images)
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(size[b], size[a]) })
	return out
}

// Resume serves a loaded bundle again after a restart (drop-ins unchanged,
// present and pinned images skipped).
func (l *Loader) Resume(ctx context.Context, meta *bundle.Metadata, images []string, dir string, keep []string) error {
	return l.load(ctx, meta, dir, keep, nil, images)
}

// load serves dir and loads images (meta's as Load takes them, in the
// order to pull them).
func (l *Loader) load(ctx context.Context, meta *bundle.Metadata, dir string, keep []string, progress func(done, total int), images []string) error {
	reg, err := l.serve(dir)
	if err != nil {
		return err
	}
	req := RequestFor(images)
	req.Keep, req.Addr, req.CACert, req.Label, req.Progress = bundle.PullRefs(keep), reg.Addr(), reg.CACertPEM(), meta.DirName(), progress
	_, err = l.Runtime.Load(ctx, req)
	return err
}

// Retire ends a bundle whose upgrade is done: mirror and CA go, the
// registry stops; the pins stay.
func (l *Loader) Retire(ctx context.Context, meta *bundle.Metadata, dir string) error {
	return l.takeOut(ctx, meta, dir, l.Runtime.Retire)
}

// Cleanup takes out a bundle that never became the cluster's release.
func (l *Loader) Cleanup(ctx context.Context, meta *bundle.Metadata, dir string) error {
	return l.takeOut(ctx, meta, dir, l.Runtime.Unload)
}

// Restore loads again, from the retired bundle's tree in dir, the images
// of it that CRI-O lacks (it lost them, or this node came back empty),
// then takes the mirror out as Retire does; the pins never left. It
// returns how many images CRI-O lacked; with none, nothing is served.
func (l *Loader) Restore(ctx context.Context, meta *bundle.Metadata, images []string, dir string) (int, error) {
	refs := RequestFor(images).Pull
	have, err := l.Runtime.Present(ctx, refs)
	if err != nil {
		return 0, err
	}
	missing := 0
	for _, ref := range refs {
		if !have[ref] {
			missing++
		}
	}
	if missing == 0 {
		return 0, nil
	}
	if l.Log != nil {
		l.Log.Warn("CRI-O lacks images of the running release: loading them again from the copy kept on this node", "bundle_dir", meta.DirName(), "missing", missing, "of", len(refs))
	}
	if err := l.Load(ctx, meta, images, dir, nil, func(int, int) {}); err != nil {
		return missing, err
	}
	return missing, l.Retire(ctx, meta, dir)
}

// Unpin drops the pins of a bundle's images (the previous bundle's).
func (l *Loader) Unpin(ctx context.Context, meta *bundle.Metadata, images []string) error {
	req := RequestFor(images)
	req.Label = meta.DirName()
	return l.Runtime.Unpin(ctx, req)
}

func (l *Loader) takeOut(ctx context.Context, meta *bundle.Metadata, dir string, op func(context.Context, crio.Request) error) error {
	addr, err := l.addr()
	if err != nil {
		return err
	}
	req := RequestFor(meta.AllImages())
	req.Addr, req.Label = addr, meta.DirName()
	if err := op(ctx, req); err != nil {
		return err
	}
	l.mu.Lock()
	serving := l.dir == dir
	l.mu.Unlock()
	if serving {
		l.closeRegistry()
	}
	return nil
}
