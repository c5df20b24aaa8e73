package load

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/diskspace"
	"github.com/ferry-edge/ferry/internal/imagetree"
)

// The room a load asks for is twice the blobs of the images CRI-O does not
// hold, each blob once (two images sharing their layer count it once; an
// image CRI-O holds counts nothing), and nothing when it holds them all.
// Images are pulled biggest first.
func TestLoader_AsksRoomForTwiceWhatCRIODoesNotHold(t *testing.T) {
	l, rt := newLoader(t)
	tree := imagetree.Tree{}
	shared := imagetree.Layer("shared", 100<<10)
	a := tree.Add("quay.io/x/a", shared)
	b := tree.Add("quay.io/x/b", shared)
	held := tree.Add("quay.io/x/held", imagetree.Layer("held", 300<<10))
	meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: a, Images: []string{b, held}}
	dir := writeTree(t, tree)
	rt.present = map[string]bool{held: true}
	must(t, l.Load(t.Context(), meta, meta.AllImages(), dir, nil, nil))
	_, d, _ := strings.Cut(a, "@")
	var m struct{ Config struct{ Size int64 } } // a's manifest names its config's size
	must(t, json.Unmarshal(tree[imagetree.BlobPath(d)], &m))
	if want := 2 * (int64(len(shared)) + m.Config.Size); rt.need != want || !strings.Contains(rt.what, "2 images") {
		t.Fatalf("asked for %d bytes (%s), want %d", rt.need, rt.what, want)
	}
	if got := rt.last.Pull; len(got) != 3 || got[0] != held {
		t.Errorf("pull order %v: the biggest image (%s) first", got, held)
	}
	rt.present = map[string]bool{held: true, a: true, b: true}
	rt.need, rt.what = -1, ""
	must(t, l.Load(t.Context(), meta, meta.AllImages(), dir, nil, nil))
	if rt.need != -1 {
		t.Fatalf("asked for %d bytes although CRI-O holds every image", rt.need)
	}
}

// Before a bundle is written on a node, the room for it and for its load
// is checked: the bytes written on the image store's filesystem, and twice
// what the images CRI-O lacks may need, sized from the metadata never
// below what the tree will say: the whole bundle without per-image sizes,
// their sum (or the bundle less the biggest image CRI-O holds) with them.
func TestLoader_CheckRoomBeforeCountsTheWritesAndTheImagesCRIOLacks(t *testing.T) {
	const gib = 1 << 30
	ref := func(i int) string { return fmt.Sprintf("quay.io/a/i%d@sha256:%064x", i, i) }
	meta := func(sizes ...int64) *bundle.Metadata {
		m := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", SizeBytes: 10 * gib, Release: ref(0),
			Images: []string{ref(1), ref(2), ref(3)}}
		if len(sizes) > 0 {
			m.ImageBytes = map[string]int64{}
			for i, n := range sizes {
				m.ImageBytes[ref(i)] = n
			}
		}
		return m
	}
	tree, tar := "/var/lib/upgrade", "/var/lib/ferry"
	for _, tc := range []struct {
		name    string
		meta    *bundle.Metadata
		present []int
		apart   []string
		noList  bool
		writes  map[string]int64
		need    int64 // 0: CheckRoom not asked
		says    []string
	}{
		{"no per-image sizes: the whole bundle", meta(), []int{1}, nil, false, map[string]int64{tree: 10 * gib},
			10*gib + 2*10*gib + 1, []string{"writing the bundle (10 GiB)", "3 images", "2 × 10 GiB", "no per-image sizes", "keeping 1 B free"}},
		{"per-image sizes: those CRI-O lacks", meta(1*gib, 6*gib, 2*gib, 1*gib), []int{1}, nil, false, map[string]int64{tree: 10 * gib},
			10*gib + 2*4*gib + 1, []string{"3 images", "2 × 4 GiB", "sizes in the bundle's metadata"}},
		{"per-image sizes overlapping: the bundle less the biggest held", meta(9*gib, 3*gib, 9*gib, 9*gib), []int{1}, nil, false, nil,
			2*7*gib + 1, []string{"2 × 7 GiB"}},
		{"a fetch: tar and tree on the store's filesystem", meta(), nil, nil, false, map[string]int64{tree: 10 * gib, tar: 10 * gib},
			20*gib + 2*10*gib + 1, []string{"writing the bundle (20 GiB)", "4 images"}},
		{"the tree on another filesystem", meta(), nil, []string{tree}, false, map[string]int64{tree: 10 * gib},
			2*10*gib + 1, []string{"loading the 4 images"}},
		{"CRI-O holds all, the tree elsewhere: nothing to ask", meta(), []int{0, 1, 2, 3}, []string{tree}, false, map[string]int64{tree: 10 * gib},
			0, nil},
		{"CRI-O holds all: the tree only", meta(), []int{0, 1, 2, 3}, nil, false, map[string]int64{tree: 10 * gib},
			10*gib + 1, []string{"writing the bundle (10 GiB) and keeping"}},
		{"CRI-O cannot say: every image missing", meta(), []int{0, 1, 2, 3}, []string{tree}, true, map[string]int64{tree: 10 * gib},
			2*10*gib + 1, []string{"4 images"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, rt := newLoader(t)
			l.RoomFloor = 1
			rt.present, rt.apart, rt.need = map[string]bool{}, map[string]bool{}, 0
			for _, i := range tc.present {
				rt.present[ref(i)] = true
			}
			for _, d := range tc.apart {
				rt.apart[d] = true
			}
			if tc.noList {
				rt.noList = errors.New("crio is down")
			}
			must(t, l.CheckRoomBefore(t.Context(), tc.meta, tc.writes))
			if rt.need != tc.need {
				t.Fatalf("asked for %s (%s), want %s", bundle.HumanSize(rt.need), rt.what, bundle.HumanSize(tc.need))
			}
			for _, w := range tc.says {
				if !strings.Contains(rt.what, w) {
					t.Errorf("%q does not say %q", rt.what, w)
				}
			}
		})
	}
	l, rt := newLoader(t)
	rt.room = bundle.ErrNoSpace
	if err := l.CheckRoomBefore(t.Context(), meta(), nil); !errors.Is(err, bundle.ErrNoSpace) {
		t.Fatalf("got %v", err)
	}
}

// The image store's room check holds a load to what the kubelet tolerates on the image
// store, and says how much to free there.
func TestImageStore_CheckRoomKeepsTheKubeletsThresholds(t *testing.T) {
	dir := t.TempDir()
	l := ImageStore{Dir: dir}
	if err := l.CheckRoom(1, "one byte"); err != nil {
		t.Errorf("1 byte: %v", err)
	}
	total, free, err := diskspace.Usage(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Up to the image GC threshold fits; one byte more crosses it (or the
	// eviction threshold, whichever is nearer).
	l.Limits = diskspace.Limits{GCHighPercent: 100}
	if err := l.CheckRoom(free/2, "half the free space"); err != nil {
		t.Errorf("half the free space with GC at 100%%: %v", err)
	}
	used := total - free
	l.Limits = diskspace.Limits{GCHighPercent: float64(used+free/2) * 100 / float64(total)}
	err = l.CheckRoom(free-free/4, "three quarters of the free space")
	if !errors.Is(err, diskspace.ErrNoSpace) || !strings.Contains(err.Error(), "imageGCHighThresholdPercent") ||
		!strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "crictl rmi --prune") || !strings.Contains(err.Error(), "free ") {
		t.Fatalf("got %v", err)
	}
	t.Log(err)
	if err := (ImageStore{Dir: filepath.Join(dir, "none")}).CheckRoom(1<<62, "anything"); err != nil {
		t.Errorf("no store yet: %v", err)
	}
}
