package crio_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
)

// The life of pins across two upgrades: bundle N's stay after its upgrade
// (its mirror and CA go), bundle N+1 loads keeping them, and N+1's end
// unpins what only N held.
func TestRetireThenUnpin_PinsLiveUntilTheNextUpgradeIsDone(t *testing.T) {
	l, f, ds := newRuntime(t)
	first := manyImages(4)
	shared := first[1]
	second := []string{fmt.Sprintf("quay.io/openshift-release-dev/ocp-release@sha256:%064x", 99), shared}

	req := request(t, first)
	if _, err := l.Load(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if err := l.Retire(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName)); !os.IsNotExist(err) {
		t.Fatal("the mirror drop-in outlived the upgrade")
	}
	if _, err := os.Stat(filepath.Join(ds.d.CertsDir, req.Addr, "ca.crt")); !os.IsNotExist(err) {
		t.Fatal("the CA outlived the upgrade")
	}
	pinned := func(ref string) bool {
		_, p, err := f.Status(t.Context(), ref)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, ref := range bundle.PullRefs(first) {
		if !pinned(ref) {
			t.Fatalf("%s unpinned by the upgrade's end; it must stay until the next one", ref)
		}
	}

	next := request(t, second)
	next.Keep = bundle.PullRefs(first)
	if _, err := l.Load(t.Context(), next); err != nil {
		t.Fatal(err)
	}
	for _, ref := range bundle.PullRefs(append(first, second...)) {
		if !pinned(ref) {
			t.Fatalf("%s not pinned while both releases may run", ref)
		}
	}

	var gone []string
	for _, ref := range first {
		if !slices.Contains(second, ref) {
			gone = append(gone, ref)
		}
	}
	if err := l.Unpin(t.Context(), requestFor(gone, "", nil, "previous")); err != nil {
		t.Fatal(err)
	}
	for _, ref := range bundle.PullRefs(gone) {
		if pinned(ref) {
			t.Errorf("%s still pinned after the next upgrade", ref)
		}
	}
	for _, ref := range bundle.PullRefs(second) {
		if !pinned(ref) {
			t.Errorf("%s of the running release was unpinned", ref)
		}
	}
}
