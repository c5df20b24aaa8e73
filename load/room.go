package load

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/diskspace"
)

// Room in the image store, checked before a bundle is written and again
// before it is loaded: CRI-O stores layers uncompressed, and a load that
// crosses what the kubelet tolerates makes it evict pods or delete images.

// Store is the runtime's image store as the room checks need it
// (ImageStore); a nil Store has room for anything.
type Store interface {
	// SameFilesystem tells whether dir is on the image store's filesystem.
	SameFilesystem(dir string) bool
	// CheckRoom fails (diskspace.ErrNoSpace) when writing need bytes
	// (what, in words) to the image store would cross what the kubelet
	// tolerates there.
	CheckRoom(need int64, what string) error
}

var _ Store = ImageStore{}

// ImageStore is CRI-O's image store on this node, where the kubelet
// watches its image filesystem.
type ImageStore struct {
	// Dir is the store ("/var/lib/containers/storage"); "" or not there
	// yet: nothing to check.
	Dir string
	// Limits are what the kubelet tolerates on the store (its eviction
	// and image GC thresholds); zero: read from KubeletConfig at each
	// check (the MCO may change it), else the kubelet's defaults.
	Limits        diskspace.Limits
	KubeletConfig string
	// Log is told when the kubelet's config cannot be read; nil discards.
	Log *slog.Logger
}

// SameFilesystem tells whether dir is on the image store's filesystem (on
// RHCOS, /var/lib/upgrade and /var/lib/containers both are /var).
func (s ImageStore) SameFilesystem(dir string) bool {
	var a, b unix.Stat_t
	return s.Dir != "" && unix.Stat(s.Dir, &a) == nil && unix.Stat(dir, &b) == nil && a.Dev == b.Dev
}

// CheckRoom returns diskspace.ErrNoSpace when writing need bytes (what,
// in words) to the image store would cross what the kubelet tolerates
// there (Limits): it would evict pods or delete images. No store yet:
// nothing to check.
func (s ImageStore) CheckRoom(need int64, what string) error {
	if _, err := os.Stat(s.Dir); s.Dir == "" || err != nil {
		return nil
	}
	return s.limits().CheckRoom(s.Dir, need, what, "'crictl rmi --prune' removes the images no container uses")
}

func (s ImageStore) limits() diskspace.Limits {
	if s.Limits != (diskspace.Limits{}) {
		return s.Limits
	}
	if s.KubeletConfig == "" {
		return diskspace.DefaultLimits
	}
	lim, err := diskspace.ReadKubeletLimits(s.KubeletConfig)
	if err != nil && s.Log != nil {
		s.Log.Warn("cannot read some of the kubelet's thresholds; using its defaults for those (imagefs.available 15%, image GC at 85%)", "err", err)
	}
	return lim
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
		if b > 0 && l.Store != nil && l.Store.SameFilesystem(dir) {
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

// checkRoom asks the image store for need bytes (what, in words) and the
// floor; nothing to write, or no store, nothing to check.
func (l *Loader) checkRoom(need int64, what []string) error {
	if need <= 0 || l.Store == nil {
		return nil
	}
	if l.RoomFloor > 0 {
		need += l.RoomFloor
		what = append(what, fmt.Sprintf("keeping %s free (crio.storage_floor_bytes)", bundle.HumanSize(l.RoomFloor)))
	}
	return l.Store.CheckRoom(need, strings.Join(what, " and "))
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
