package crio_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/crio/critest"
	"github.com/ferry-edge/ferry/load"
	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// testBundle is an extracted bundle: synthetic images under quay.io names
// in a registry tree (the fixture's storage), metadata.json beside it, and
// ferry's embedded registry serving it.
type testBundle struct {
	Images  []string // metadata: release, then images
	Fixture *fixture.Registry
	Reg     *registry.Registry
}

// makeBundle makes a bundle of a release, payload images and one custom
// image kept with its tag (pushed by digest only: the embedded registry
// serves the tag from metadata.json).
func makeBundle(t testing.TB, payload int, size int64) *testBundle {
	t.Helper()
	fx := fixture.NewRegistry(t)
	release, refs := fx.PushRelease(t, fixture.ReleaseOptions{PayloadImages: payload, ImageSize: size})
	custom := fx.PushImage(t, "my-company/app", "")
	name, _, digest := bundle.SplitRef(custom)
	images := append(refs, name+":v1@"+digest)
	md := map[string]any{"formatVersion": 1, "version": "4.13.7", "arch": "x86_64", "size": "1 MiB", "sizeBytes": 1 << 20,
		"release": release, "images": images, "created": time.Now().UTC()}
	b, _ := json.Marshal(md)
	crioenv.Write(t, filepath.Join(fx.Dir, bundle.MetadataName), string(b))

	log, _ := newTestLog(t)
	reg, err := registry.New(t.TempDir(), 0, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Serve(ctx, fx.Dir) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	return &testBundle{Images: append([]string{release}, images...), Fixture: fx, Reg: reg}
}

func (b *testBundle) request() crio.Request {
	return requestFor(b.Images, b.Reg, "4.13.7-x86_64")
}

// requestFor is what the agent asks of CRI-O for images served by reg
// (load.RequestFor).
func requestFor(images []string, reg *registry.Registry, label string) crio.Request {
	r := load.RequestFor(images)
	r.Addr, r.CACert, r.Label = reg.Addr(), reg.CACertPEM(), label
	return r
}

// sighupAndWait reloads CRI-O and waits until its live config pins want.
func sighupAndWait(t *testing.T, c *crioenv.CRIO, want []string) {
	t.Helper()
	if err := c.Reloader().Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	cl := c.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		live, err := cl.PinnedImages(t.Context())
		if err == nil && slices.Equal(onlyOurs(live, want), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRI-O did not apply the reload: live pins %v (%v), want %v\n%s", live, err, want, c.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func onlyOurs(live, want []string) []string {
	var out []string
	for _, w := range want {
		if slices.Contains(live, w) {
			out = append(out, w)
		}
	}
	return out
}

func TestRealCRIO_ImageServiceConformance(t *testing.T) {
	c := crioenv.Start(t)
	b := makeBundle(t, 3, 4096)
	// Mirrors and CA only; the suite sets the pins.
	mirrors, err := crio.MirrorsConf(requestFor(b.Images, b.Reg, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	crioenv.Write(t, filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName), string(mirrors))
	crioenv.Write(t, filepath.Join(c.Dropins.CertsDir, b.Reg.Addr(), "ca.crt"), string(b.Reg.CACertPEM()))
	canary := "quay.io/ferry-test/canary@sha256:" + strings.Repeat("0", 64)
	pin := func(t *testing.T, refs ...string) {
		conf, err := crio.PinsConf(append([]string{canary}, refs...), "")
		if err != nil {
			t.Fatal(err)
		}
		crioenv.Write(t, filepath.Join(c.Dropins.CRIOConfDir, crio.DropinName), string(conf))
		sighupAndWait(t, c, []string{canary})
	}
	pin(t) // applies the mirrors too
	critest.RunImageServiceSuite(t, c.Client(t), critest.Env{
		Pullable: []string{b.Images[1], b.Images[2]},
		Absent:   "127.0.0.1:1/ferry-test/absent@sha256:" + strings.Repeat("1", 64),
		Pin:      pin,
	})
}

func TestRealCRIO_LoadPinsEveryImageThroughTheMirror(t *testing.T) {
	c := crioenv.Start(t)
	b := makeBundle(t, 30, 4096)
	cl := c.Client(t)
	ctx := t.Context()

	// MCO's drop-in pins an image outside the bundle, already pulled, and
	// one of the bundle's.
	outside := b.Fixture.Local(b.Fixture.PushImage(t, "mco/thing", ""))
	mcoPins := []string{outside, bundle.PullRefs(b.Images)[5]}
	crioenv.Write(t, filepath.Join(c.Dropins.CRIOConfDir, "50-pinned-images"),
		fmt.Sprintf("[crio]\n  [crio.image]\n    pinned_images = [%q, %q]\n", mcoPins[0], mcoPins[1]))
	sighupAndWait(t, c, mcoPins)
	if _, err := cl.Pull(ctx, outside); err != nil {
		t.Fatal(err)
	}

	log, _ := newTestLog(t)
	l := &crio.Runtime{CRI: cl, Dropins: c.Dropins, Reloader: c.Reloader(), Log: log}
	req := b.request()
	var last [2]int
	req.Progress = func(done, total int) { last = [2]int{done, total} }
	res, err := l.Load(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	refs := bundle.PullRefs(b.Images)
	t.Logf("loaded %d images (%d pulled) in %s", res.Total, res.Pulled, res.Elapsed)
	if len(refs) < 30 || res.Total != len(refs) || last != [2]int{len(refs), len(refs)} {
		t.Errorf("result %+v, last progress %v, want %d images", res, last, len(refs))
	}

	fresh := c.Client(t)
	for _, r := range append(refs, mcoPins...) {
		present, pinned, err := fresh.Status(ctx, r)
		if err != nil || !present || !pinned {
			t.Errorf("%s: present=%v pinned=%v err=%v; want present and pinned", r, present, pinned, err)
		}
	}

	// Through the mirror, over TLS: every digest and the tag were
	// fetched by CRI-O from the embedded registry (pulls addressed to
	// 127.0.0.1 are not made, so each count is a mirror pull).
	s := b.Reg.Stats()
	t.Logf("registry stats: %d requests, %d manifests, %d blobs, user agents %v", s.Requests, s.Manifests, s.Blobs, s.UserAgents)
	if s.Manifests < int64(len(refs)) || s.TLS != s.Requests || s.Refused != 0 {
		t.Errorf("registry stats %+v: want ≥%d manifests, all over TLS", s, len(refs))
	}
	for _, repo := range []string{fixture.ReleaseRepo, fixture.PayloadRepo, "my-company/app"} {
		if s.ByRepo[repo] == 0 {
			t.Errorf("no manifest of %s served by the embedded registry", repo)
		}
	}
	if s.UserAgents["cri-o"] < int64(len(refs)) {
		t.Errorf("user agents %v: want ≥%d cri-o requests", s.UserAgents, len(refs))
	}

	t.Run("MirrorChecksTLSWithTheCertsDCA", func(t *testing.T) {
		// A new image in a bundle repository, pulled by its original name.
		ref := b.Fixture.PushImage(t, fixture.PayloadRepo, "")
		ca := filepath.Join(c.Dropins.CertsDir, b.Reg.Addr(), "ca.crt")
		keep, err := os.ReadFile(ca)
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(ca)
		_, err = cl.Pull(ctx, ref)
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("pull through the mirror without its CA: %v; want a certificate error", err)
		}
		crioenv.Write(t, ca, string(keep))
		if _, err := cl.Pull(ctx, ref); err != nil {
			t.Fatalf("pull with the CA back: %v", err)
		}
	})

	t.Run("LoadAgainChangesNothing", func(t *testing.T) {
		res, err := l.Load(ctx, b.request())
		if err != nil {
			t.Fatal(err)
		}
		if res.Reloaded || res.Pulled != 0 {
			t.Errorf("second load %+v: want no reload, no pull", res)
		}
	})

	t.Run("CleanupUnpinsAndRemoves", func(t *testing.T) {
		if err := l.Unload(ctx, b.request()); err != nil {
			t.Fatal(err)
		}
		for _, r := range refs {
			_, pinned, err := fresh.Status(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if want := slices.Contains(mcoPins, r); pinned != want {
				t.Errorf("%s pinned=%v after cleanup, want %v", r, pinned, want)
			}
		}
		if _, pinned, _ := fresh.Status(ctx, outside); !pinned {
			t.Errorf("%s (MCO's pin) unpinned by cleanup", outside)
		}
		for _, p := range []string{
			filepath.Join(c.Dropins.CRIOConfDir, crio.DropinName),
			filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName),
			filepath.Join(c.Dropins.CertsDir, b.Reg.Addr()),
		} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%s left after cleanup", p)
			}
		}
		if _, err := os.Stat(filepath.Join(c.Dropins.CRIOConfDir, "50-pinned-images")); err != nil {
			t.Errorf("MCO's drop-in: %v", err)
		}
	})
}

func TestRealCRIO_LoaderWaitsForCRIOKilledMidLoad(t *testing.T) {
	c := crioenv.Start(t)
	b := makeBundle(t, 40, 64<<10)
	log, tl := newTestLog(t)
	l := &crio.Runtime{CRI: c.Client(t), Dropins: c.Dropins, Reloader: c.Reloader(), Log: log, Workers: 2, CRIOWait: 2 * time.Minute}
	req := b.request()
	kill := make(chan struct{})
	var once sync.Once
	req.Progress = func(done, total int) {
		if done >= 8 {
			once.Do(func() { close(kill) })
		}
	}
	type result struct {
		res crio.Result
		err error
	}
	out := make(chan result, 1)
	go func() {
		res, err := l.Load(t.Context(), req)
		out <- result{res, err}
	}()
	select {
	case <-kill:
	case r := <-out:
		t.Fatalf("load ended before CRI-O was killed: %+v %v", r.res, r.err)
	}
	c.Kill(t)
	// The loader sees CRI-O gone before it comes back.
	for !tl.Contains("CRI-O is not answering") {
		select {
		case r := <-out:
			t.Fatalf("load ended while CRI-O was down: %+v %v", r.res, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	c.Start(t)
	r := <-out
	if r.err != nil {
		t.Fatalf("load after CRI-O came back: %v", r.err)
	}
	if !tl.Contains("CRI-O is answering again") {
		t.Error("no log line saying CRI-O came back")
	}
	cl := c.Client(t)
	for _, ref := range bundle.PullRefs(b.Images) {
		present, pinned, err := cl.Status(t.Context(), ref)
		if err != nil || !present || !pinned {
			t.Errorf("%s: present=%v pinned=%v err=%v", ref, present, pinned, err)
		}
	}
}
