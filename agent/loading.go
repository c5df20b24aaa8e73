package agent

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/ferry-edge/ferry/bundle"
)

// The loading effect: an extracted bundle served by the embedded registry
// and put into CRI-O through its drop-ins, reload and CRI. The registry
// and CRI-O each stay behind a narrow seam; the one piece that knows
// bundles is this one.

// BundleServer serves one extracted bundle on loopback (registry.Registry).
type BundleServer interface {
	// Serve serves the tree under root until ctx ends or Close.
	Serve(ctx context.Context, root string) error
	Addr() string
	CACertPEM() []byte
	Close() error
}

// Runtime is CRI-O as loading needs it (crio.Loader): it takes image
// lists and a registry address, and knows no bundles.
type Runtime interface {
	// Load writes the drop-ins (mirror to addr, pins), reloads, pulls and
	// pins every image.
	Load(ctx context.Context, r RuntimeRequest) error
	// Unload removes pins, mirror and CA.
	Unload(ctx context.Context, r RuntimeRequest) error
	// Retire removes the mirror and CA; the pins stay.
	Retire(ctx context.Context, r RuntimeRequest) error
	// Unpin drops the pins of r.Images.
	Unpin(ctx context.Context, r RuntimeRequest) error
	// Present tells which of refs the runtime holds.
	Present(ctx context.Context, refs []string) (map[string]bool, error)
	// SameFilesystem tells whether dir is on the image store's filesystem.
	SameFilesystem(dir string) bool
	// CheckRoom fails (diskspace.ErrNoSpace) when writing need bytes
	// (what, in words) to the image store would cross what the kubelet
	// tolerates there.
	CheckRoom(need int64, what string) error
}

// RuntimeRequest is one set of images for the runtime.
type RuntimeRequest struct {
	Images   []string // name[:tag]@sha256:…
	Keep     []string // more pins to hold
	Addr     string   // the embedded registry's
	CACert   []byte
	Label    string // names the bundle in drop-ins ("4.13.7-x86_64")
	Progress func(done, total int)
}

// Loading is the agent's Loader on a BundleServer and a Runtime. Its registry
// runs under the context given to Run, which the caller runs with its
// other servers: nothing of it outlives the agent.
type Loading struct {
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

// Run gives Loading its lifetime: registries are served until ctx ends.
func (l *Loading) Run(ctx context.Context) error {
	l.mu.Lock()
	l.parent = ctx
	l.mu.Unlock()
	<-ctx.Done()
	l.closeRegistry()
	return nil
}

// Load serves dir and loads meta's images, pinned; keep are the previous
// bundle's pins. Calling it again for the same bundle is cheap.
func (l *Loading) Load(ctx context.Context, meta *bundle.Metadata, dir string, keep []string, progress func(done, total int)) error {
	blobs, err := bundle.ImageBlobs(dir, meta.AllImages(), bundle.GoArch(meta.Arch))
	if err != nil {
		return fmt.Errorf("%w: the extracted bundle in %s is damaged (%v): run 'ferry cleanup' and give the bundle again", bundle.ErrInvalid, dir, err)
	}
	if err := l.checkRoom(ctx, blobs); err != nil {
		return err
	}
	return l.load(ctx, meta, dir, keep, progress, biggestFirst(meta.AllImages(), blobs))
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

// CheckRoomBefore is the room check before a bundle is extracted or
// fetched, on every node: writes bytes under dir, then its load. The tree
// that sizes the load exactly is not there yet, so the images CRI-O lacks
// are estimated as their share, by count, of the bundle's size; Load
// checks exactly once the tree is there.
func (l *Loading) CheckRoomBefore(ctx context.Context, meta *bundle.Metadata, dir string, writes int64) error {
	images := meta.AllImages()
	refs := make([]string, len(images))
	for i, ref := range images {
		refs[i] = bundle.PullRefs([]string{ref})[0]
	}
	present, _ := l.Runtime.Present(ctx, refs) // unknown: every image counted as missing
	n := 0
	for _, r := range refs {
		if !present[r] {
			n++
		}
	}
	var est int64
	if len(images) > 0 {
		est = meta.SizeBytes / int64(len(images)) * int64(n)
	}
	need := 2*est + l.RoomFloor
	what := fmt.Sprintf("loading the %d images CRI-O does not hold (about 2 × %s)", n, bundle.HumanSize(est))
	if l.Runtime.SameFilesystem(dir) {
		need += writes
		what = fmt.Sprintf("writing the bundle (%s) and %s", bundle.HumanSize(writes), what)
	}
	return l.Runtime.CheckRoom(need, what)
}

// checkRoom: the runtime stores layers uncompressed, so a load needs
// twice the bytes of the blobs it does not hold yet (per image it lacks,
// counting a blob once), within what the kubelet tolerates.
func (l *Loading) checkRoom(ctx context.Context, blobs map[string]map[string]int64) error {
	byDigest := make(map[string]string, len(blobs)) // image → the name it is pulled by
	refs := make([]string, 0, len(blobs))
	for ref := range blobs {
		byDigest[ref] = bundle.PullRefs([]string{ref})[0]
		refs = append(refs, byDigest[ref])
	}
	present, err := l.Runtime.Present(ctx, refs)
	if err != nil {
		present = nil // counted as missing: the check errs on the safe side
	}
	missing, n := bundle.MissingBytes(blobs, func(ref string) bool { return present[byDigest[ref]] })
	if n == 0 {
		return nil
	}
	what := fmt.Sprintf("loading the %d images CRI-O does not hold (2 × their %s: layers are stored uncompressed)", n, bundle.HumanSize(missing))
	return l.Runtime.CheckRoom(2*missing+l.RoomFloor, what)
}

// Resume serves a loaded bundle again after a restart (drop-ins unchanged,
// present and pinned images skipped).
func (l *Loading) Resume(ctx context.Context, meta *bundle.Metadata, dir string, keep []string) error {
	return l.load(ctx, meta, dir, keep, nil, meta.AllImages())
}

// load serves dir and loads images (meta's, in the order to pull them).
func (l *Loading) load(ctx context.Context, meta *bundle.Metadata, dir string, keep []string, progress func(done, total int), images []string) error {
	reg, err := l.serve(dir)
	if err != nil {
		return err
	}
	return l.Runtime.Load(ctx, RuntimeRequest{Images: images, Keep: keep, Addr: reg.Addr(),
		CACert: reg.CACertPEM(), Label: meta.DirName(), Progress: progress})
}

// Retire ends a bundle whose upgrade is done: mirror and CA go, the
// registry stops; the pins stay.
func (l *Loading) Retire(ctx context.Context, meta *bundle.Metadata, dir string) error {
	return l.takeOut(ctx, meta, dir, l.Runtime.Retire)
}

// Cleanup takes out a bundle that never became the cluster's release.
func (l *Loading) Cleanup(ctx context.Context, meta *bundle.Metadata, dir string) error {
	return l.takeOut(ctx, meta, dir, l.Runtime.Unload)
}

// Unpin drops the pins of images (the previous bundle's).
func (l *Loading) Unpin(ctx context.Context, images []string) error {
	return l.Runtime.Unpin(ctx, RuntimeRequest{Images: images, Label: "previous bundle"})
}

func (l *Loading) takeOut(ctx context.Context, meta *bundle.Metadata, dir string, op func(context.Context, RuntimeRequest) error) error {
	addr, err := l.addr()
	if err != nil {
		return err
	}
	if err := op(ctx, RuntimeRequest{Images: meta.AllImages(), Addr: addr, Label: meta.DirName()}); err != nil {
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
func (l *Loading) addr() (string, error) {
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
func (l *Loading) serve(dir string) (BundleServer, error) {
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
		return nil, fmt.Errorf("the embedded registry cannot start: Loading.Run was not started")
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
func (l *Loading) closeRegistry() {
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
