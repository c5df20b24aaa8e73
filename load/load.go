// Package load puts an extracted bundle into CRI-O: it serves the bundle's
// tree with the embedded registry, asks CRI-O to pull and pin its images
// through it, and checks first that the image store has room. It is the
// agent's Loader (agent.Loader), wired in cmd/ferry.
package load

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
)

// The registry and CRI-O each stay behind a narrow seam; the one piece
// that knows bundles is this one.

// BundleServer serves one extracted bundle on loopback (registry.Registry).
type BundleServer interface {
	// Serve serves the tree under root until ctx ends or Close.
	Serve(ctx context.Context, root string) error
	Addr() string
	CACertPEM() []byte
	Close() error
}

// Runtime is CRI-O as loading needs it (crio.Loader): it takes image
// references and a registry address, and knows no bundles.
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
	// SameFilesystem tells whether dir is on the image store's filesystem.
	SameFilesystem(dir string) bool
	// CheckRoom fails (diskspace.ErrNoSpace) when writing need bytes
	// (what, in words) to the image store would cross what the kubelet
	// tolerates there.
	CheckRoom(need int64, what string) error
}

var _ Runtime = (*crio.Loader)(nil)

// RequestFor is what CRI-O is asked for images (a bundle's, as
// metadata.json names them: name[:tag]@sha256:…, in the order to pull
// them): each pulled and pinned by digest and, when it kept its tag, by
// tag too (bundle.PullRefs), each repository mirrored at the path the
// bundle stores it under (bundle.RepoPaths), which is where the embedded
// registry serves it. The caller adds the registry and the label.
func RequestFor(images []string) crio.Request {
	return crio.Request{Pull: bundle.PullRefs(images), Mirrors: bundle.RepoPaths(images)}
}

// Loader is the agent's Loader on a BundleServer and a Runtime. Its registry
// runs under the context given to Run, which the caller runs with its
// other servers: nothing of it outlives the agent.
type Loader struct {
	// OpenRegistry binds the registry (its port and certificate are kept
	// across restarts).
	OpenRegistry func() (BundleServer, error)
	Runtime      Runtime
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

// Run gives the Loader its lifetime: registries are served until ctx ends.
func (l *Loader) Run(ctx context.Context) error {
	l.mu.Lock()
	l.parent = ctx
	l.mu.Unlock()
	<-ctx.Done()
	l.closeRegistry()
	return nil
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

// CheckRoomBefore is the room check before a bundle's bytes are written
// on this node, on every node: before a stick's (or a file's) bundle is
// extracted and before a peer's is fetched. writes are the bytes about to
// be written, by directory; those on the image store's filesystem (on
// RHCOS /var/lib/upgrade, /var/lib/ferry and /var/lib/containers all are
// /var) count with the load. The tree that sizes the load exactly is not
// there yet: bundle.EstimateMissingBytes sizes it from the metadata, never
// below the exact count, so that a bundle that passes here does not fail
// Load's exact check with its tree written.
func (l *Loader) CheckRoomBefore(ctx context.Context, meta *bundle.Metadata, writes map[string]int64) error {
	present := l.present(ctx, meta.AllImages())
	est, n, perImage := bundle.EstimateMissingBytes(meta, present)
	var need, written int64
	for dir, b := range writes {
		if b > 0 && l.Runtime.SameFilesystem(dir) {
			written += b
		}
	}
	var what []string
	if written > 0 {
		need += written
		what = append(what, fmt.Sprintf("writing the bundle (%s)", bundle.HumanSize(written)))
	}
	if n > 0 {
		need += 2 * est
		basis := "their sizes in the bundle's metadata"
		if !perImage {
			basis = "the whole bundle: its metadata has no per-image sizes"
		}
		what = append(what, fmt.Sprintf("loading the %d images CRI-O does not hold (2 × %s, from %s: layers are stored uncompressed)", n, bundle.HumanSize(est), basis))
	}
	return l.checkRoom(need, what)
}

// checkLoadRoom: the runtime stores layers uncompressed, so a load needs
// twice the bytes of the blobs it does not hold yet (per image it lacks,
// counting a blob once, less those of the images it holds), within what
// the kubelet tolerates.
func (l *Loader) checkLoadRoom(ctx context.Context, blobs map[string]map[string]int64) error {
	images := make([]string, 0, len(blobs))
	for ref := range blobs {
		images = append(images, ref)
	}
	missing, n := bundle.MissingBytes(blobs, l.present(ctx, images))
	if n == 0 {
		return nil
	}
	return l.checkRoom(2*missing, []string{fmt.Sprintf("loading the %d images CRI-O does not hold (2 × their %s: layers are stored uncompressed)", n, bundle.HumanSize(missing))})
}

// checkRoom asks the runtime for need bytes (what, in words) and the
// floor; nothing to write, nothing to check.
func (l *Loader) checkRoom(need int64, what []string) error {
	if need <= 0 {
		return nil
	}
	if l.RoomFloor > 0 {
		need += l.RoomFloor
		what = append(what, fmt.Sprintf("keeping %s free (crio.storage_floor_bytes)", bundle.HumanSize(l.RoomFloor)))
	}
	return l.Runtime.CheckRoom(need, strings.Join(what, " and "))
}

// present tells, by metadata reference, whether the runtime holds each of
// images (by the name it is pulled as). When it cannot tell, none: the
// room checks then err on the safe side.
func (l *Loader) present(ctx context.Context, images []string) func(ref string) bool {
	pull := make(map[string]string, len(images))
	refs := make([]string, 0, len(images))
	for _, ref := range images {
		pull[ref] = bundle.PullRefs([]string{ref})[0]
		refs = append(refs, pull[ref])
	}
	held, err := l.Runtime.Present(ctx, refs)
	if err != nil {
		if l.Log != nil {
			l.Log.Warn("cannot ask CRI-O which images it holds; counting them all as missing", "err", err)
		}
		held = nil
	}
	return func(ref string) bool { return held[pull[ref]] }
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
	req.Keep, req.Addr, req.CACert, req.Label, req.Progress = keep, reg.Addr(), reg.CACertPEM(), meta.DirName(), progress
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

// Unpin drops the pins of images (the previous bundle's).
func (l *Loader) Unpin(ctx context.Context, images []string) error {
	req := RequestFor(images)
	req.Label = "previous bundle"
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
