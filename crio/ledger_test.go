package crio_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
)

const imageX = "registry.example/mco/x@sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"

// mcoFile is 50-pinned-images as the machine config operator writes it.
func mcoFile(pins ...string) string {
	s := "[crio]\n  [crio.image]\n    pinned_images = ["
	for i, p := range pins {
		if i > 0 {
			s += ", "
		}
		s += `"` + p + `"`
	}
	return s + "]\n"
}

func ferryPins(t *testing.T, ds dirs) []string {
	t.Helper()
	p := filepath.Join(ds.d.CRIOConfDir, crio.DropinName)
	if _, err := os.Stat(p); os.IsNotExist(err) {
		return nil
	}
	return decodePins(t, p)
}

func hasAll(got, want []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// A PinnedImageSet created after ferry wrote its file is pinned once ferry
// syncs; one deleted leaves ferry's file too, the bundle's pins stay.
func TestSync_FollowsAnotherFilesPinsBothWays(t *testing.T) {
	ds := newDirs(t)
	req := requestFor(bundleImages, "127.0.0.1:5443", testCA(t, true), "4.13.7-x86_64")
	if _, err := ds.d.Apply(req); err != nil {
		t.Fatal(err)
	}
	own := bundle.PullRefs(bundleImages)

	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoFile(imageX))
	ch, err := ds.d.Sync()
	if err != nil {
		t.Fatal(err)
	}
	if got := ferryPins(t, ds); !ch.Pins || !slices.Contains(got, imageX) || !hasAll(got, own) {
		t.Fatalf("after the MCO pinned X: change %v, ferry's pins %q", ch, got)
	}

	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoFile())
	if _, err := ds.d.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := ferryPins(t, ds); slices.Contains(got, imageX) || !hasAll(got, own) {
		t.Fatalf("after the MCO dropped X: ferry's pins %q", got)
	}
	if ch, err := ds.d.Sync(); err != nil || ch.NeedsReload() {
		t.Errorf("a sync with nothing changed: %v %v", ch, err)
	}
}

// Taking out a bundle that never ran keeps the running release's pins.
func TestRemove_KeepsTheOtherBundlesPins(t *testing.T) {
	ds := newDirs(t)
	running := []string{"quay.io/openshift-release-dev/ocp-release@" + d1, "quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d2}
	next := []string{"quay.io/openshift-release-dev/ocp-release@" + d3, "quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d2}
	a := requestFor(running, "127.0.0.1:5443", testCA(t, true), "4.13.7-x86_64")
	if _, err := ds.d.Apply(a); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.d.RemoveMirror(a.Addr); err != nil { // A upgraded: its mirror went
		t.Fatal(err)
	}
	b := requestFor(next, "127.0.0.1:5443", testCA(t, true), "4.14.0-x86_64")
	if _, err := ds.d.Apply(b); err != nil {
		t.Fatal(err)
	}
	if got := ferryPins(t, ds); !hasAll(got, bundle.PullRefs(append(running, next...))) {
		t.Fatalf("both bundles loaded: %q", got)
	}
	ch, err := ds.d.Remove(b.Addr, b.Label)
	if err != nil {
		t.Fatal(err)
	}
	got := ferryPins(t, ds)
	if !ch.Pins || !hasAll(got, bundle.PullRefs(running)) || slices.Contains(got, next[0]) {
		t.Fatalf("after B's cleanup: change %v, pins %q; want A's only", ch, got)
	}
	if _, err := os.Stat(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName)); !os.IsNotExist(err) {
		t.Error("B's mirror outlived its cleanup")
	}
	if _, err := ds.d.Remove(a.Addr, a.Label); err != nil {
		t.Fatal(err)
	}
	if got := ferryPins(t, ds); got != nil {
		t.Errorf("ferry pins nothing but its file holds %q", got)
	}
}

// A drop-in written before the ledger existed: its pins that no earlier
// file holds are taken as ferry's own; the copies of others' are not.
func TestSync_TakesInADropinFromBeforeTheLedger(t *testing.T) {
	ds := newDirs(t)
	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoFile(imageX))
	old := "quay.io/openshift-release-dev/ocp-release@" + d1
	ds.write(t, "crio/crio.conf.d/"+crio.DropinName, mcoFile(imageX, old))
	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoFile())
	if _, err := ds.d.Sync(); err != nil {
		t.Fatal(err)
	}
	// The ledger is made from the files as they are at the first sync,
	// where X is gone from the MCO's: X is taken as ferry's too (it
	// cannot tell), the MCO's pins of that moment are not.
	own, err := ds.d.Own()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(own[crio.EarlierPins], old) {
		t.Errorf("ledger %v lacks the old drop-in's own pin", own)
	}
}

// WatchConf: the MCO writes its file and reloads CRI-O; ferry follows
// within seconds and reloads CRI-O again.
func TestWatchConf_RewritesAndReloadsWhenTheMCOsFileChanges(t *testing.T) {
	l, f, ds := newRuntime(t)
	req := request(t, manyImages(3))
	if _, err := l.Load(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.present[imageX] = true
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- l.WatchConf(ctx) }()
	defer func() { cancel(); <-done }()

	pinned := func(ref string) bool {
		_, p, _ := f.Status(t.Context(), ref)
		return p
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !ok(); {
			if time.Now().After(end) {
				t.Fatalf("not within 10 s: %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	allPinned := func() bool {
		for _, ref := range req.Pull {
			if !pinned(ref) {
				return false
			}
		}
		return true
	}
	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoFile(imageX))
	f.Reload(t.Context()) // the MCO's own reload: ferry's file still hides X
	waitFor("X pinned and the bundle still pinned", func() bool { return pinned(imageX) && allPinned() })

	ds.write(t, "crio/crio.conf.d/50-pinned-images", mcoFile())
	f.Reload(t.Context())
	waitFor("X unpinned, the bundle still pinned", func() bool { return !pinned(imageX) && allPinned() })
}

// An ImageDigestMirrorSet the MCO renders into registries.conf after ferry
// wrote its mirror drop-in: ferry's entry for the same repository, which
// replaces the node's, is written again with the new mirror after ferry's
// own; once ferry's mirror is gone, nothing of the node's is touched.
func TestWatchConf_TheNodesNewMirrorsAreKeptBehindFerrysMirror(t *testing.T) {
	l, _, ds := newRuntime(t)
	ds.write(t, "containers/registries.conf", "")
	req := request(t, manyImages(3))
	if _, err := l.Load(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- l.WatchConf(ctx) }()
	defer func() { cancel(); <-done }()

	idms := `[[registry]]
  prefix = ""
  location = "quay.io/openshift-release-dev/ocp-v4.0-art-dev"
  mirror-by-digest-only = true

  [[registry.mirror]]
    location = "idms.site/ocp/art-dev"
`
	ds.write(t, "containers/registries.conf", idms)
	ours := filepath.Join(ds.d.RegistriesConfDir, crio.DropinName)
	for end := time.Now().Add(10 * time.Second); ; {
		b, _ := os.ReadFile(ours)
		if strings.Contains(string(b), `"idms.site/ocp/art-dev"`) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("ferry's mirror drop-in never took the node's new mirror:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, _ := os.ReadFile(filepath.Join(ds.root, "containers/registries.conf")); string(b) != idms {
		t.Errorf("the node's registries.conf changed: %q", b)
	}
}
