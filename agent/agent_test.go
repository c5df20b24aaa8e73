package agent

import (
	"context"
	"errors"
	"github.com/ferry-edge/ferry/agent/machine"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/internal/digest"
)

// fakeDevices is a DeviceSource the test feeds.
type fakeDevices struct{ ch chan machine.DeviceEvent }

func (f *fakeDevices) Events(ctx context.Context) (<-chan machine.DeviceEvent, error) {
	return f.ch, nil
}

// fakeMedia maps a device to the bundles on it.
type fakeMedia struct {
	mu     sync.Mutex
	sticks map[string][]bundle.Source
	open   int
}

func (f *fakeMedia) Open(_ context.Context, ev machine.DeviceEvent) (Medium, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sticks[ev.Device]
	if !ok {
		return nil, errors.New("no medium")
	}
	f.open++
	return &fakeMedium{f: f, srcs: s}, nil
}

func (f *fakeMedia) opened() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open
}

type fakeMedium struct {
	f    *fakeMedia
	srcs []bundle.Source
}

func (m *fakeMedium) Bundles() []bundle.Source { return m.srcs }
func (m *fakeMedium) Close() error {
	m.f.mu.Lock()
	m.f.open--
	m.f.mu.Unlock()
	return nil
}

// fakeLoader records loads; fail makes the next n loads fail.
type fakeLoader struct {
	mu       sync.Mutex
	loads    []string
	cleanups int
	retires  []string
	unpinned []string
	restored []string
	present  map[string]bool // images the fake CRI-O holds, for Restore: nil holds none
	keeps    [][]string
	images   [][]string // what each load pulled and pinned
	fail     int
	pins     map[string][]string                 // what the fake CRI-O pins, by bundle version (ferry's ledger)
	room     error                               // CheckRoomBefore's answer
	roomFor  func(writes map[string]int64) error // or this one's
}

func (l *fakeLoader) Load(_ context.Context, m *bundle.Metadata, images []string, dir string, keep []string, progress func(int, int)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, bundle.MetadataName)); err != nil {
		return err
	}
	if l.fail > 0 {
		l.fail--
		return errors.New("crio is down")
	}
	n := len(images)
	progress(n, n)
	l.loads = append(l.loads, m.Version)
	l.keeps = append(l.keeps, keep)
	l.images = append(l.images, images)
	if l.pins == nil {
		l.pins = map[string][]string{}
	}
	l.pins[m.Version] = images
	return nil
}

// pinned tells whether some bundle pins ref (l.mu held).
func (l *fakeLoader) pinned(ref string) bool {
	for _, refs := range l.pins {
		if slices.Contains(refs, ref) {
			return true
		}
	}
	return false
}

func (l *fakeLoader) Resume(context.Context, *bundle.Metadata, []string, string, []string) error {
	return nil
}
func (l *fakeLoader) CheckRoomBefore(_ context.Context, _ *bundle.Metadata, writes map[string]int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.roomFor != nil {
		return l.roomFor(writes)
	}
	return l.room
}

func (l *fakeLoader) Retire(_ context.Context, m *bundle.Metadata, _ string) error {
	l.mu.Lock()
	l.retires = append(l.retires, m.Version)
	l.mu.Unlock()
	return nil
}

func (l *fakeLoader) Restore(_ context.Context, m *bundle.Metadata, images []string, _ string) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ref := range images {
		if !l.present[ref] {
			n++
			l.restored = append(l.restored, ref)
		}
	}
	return n, nil
}

func (l *fakeLoader) Unpin(_ context.Context, m *bundle.Metadata, images []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pins, m.Version)
	l.unpinned = append(l.unpinned, images...)
	return nil
}

func (l *fakeLoader) Cleanup(_ context.Context, m *bundle.Metadata, _ string) error {
	l.mu.Lock()
	l.cleanups++
	delete(l.pins, m.Version)
	l.mu.Unlock()
	return nil
}

// lines records STATUS= lines.
type lines struct {
	mu    sync.Mutex
	ready bool
	all   []string
}

func (l *lines) Ready() { l.mu.Lock(); l.ready = true; l.mu.Unlock() }
func (l *lines) Status(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 || l.all[len(l.all)-1] != s {
		l.all = append(l.all, s)
	}
}

// sent is every STATUS= line sent so far, and whether READY was.
func (l *lines) sent() ([]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all), l.ready
}

type harness struct {
	t      *testing.T
	cfg    Config
	dev    *fakeDevices
	media  *fakeMedia
	loader *fakeLoader
	lines  *lines
	peers  Peers
	api    *fakeAPI
	admit  func(*bundle.Metadata, bundle.Tree) (bundle.Admission, error) // Deps.Admit
	puller Puller
	agent  *Agent
	cancel context.CancelFunc
	done   chan error
	// Of drive (no loop): the retries asked for, the upgrade asks.
	retries []time.Duration
	asked   int
}

func newHarness(t *testing.T, root string) *harness {
	cfg := DefaultConfig()
	cfg.NodeName = "node-a"
	cfg.Arch = "x86_64"
	cfg.Approval = "off" // most tests are about something else; approval's own tests set it back
	cfg.Paths.StateDir = filepath.Join(root, "state")
	cfg.Paths.ExtractDir = filepath.Join(root, "upgrade")
	h := &harness{t: t, cfg: cfg, dev: &fakeDevices{ch: make(chan machine.DeviceEvent)},
		media: &fakeMedia{sticks: map[string][]bundle.Source{}}, loader: &fakeLoader{}, lines: &lines{}}
	return h
}

// harnessClock is the harness's fixed clock.
var harnessClock = time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)

// newAgent builds the agent on the harness's fakes: New, not Run.
func (h *harness) newAgent() *Agent {
	h.t.Helper()
	var api ClusterAPI
	if h.api != nil {
		api = h.api
	}
	a, err := New(h.cfg, Deps{Devices: h.dev, Media: h.media, Loader: h.loader, Notify: h.lines, Peers: h.peers,
		API: api, APIPoll: 20 * time.Millisecond, PeerPoll: 50 * time.Millisecond, RetryBase: 10 * time.Millisecond, Now: func() time.Time { return harnessClock }, Admit: h.admit,
		Puller: h.puller})
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

// start runs the agent's loop and its watchers: the real wiring.
func (h *harness) start() {
	h.t.Helper()
	a := h.newAgent()
	ctx, cancel := context.WithCancel(h.t.Context())
	h.agent, h.cancel, h.done = a, cancel, make(chan error, 1)
	go func() { h.done <- a.Run(ctx) }()
	h.t.Cleanup(h.stop)
}

func (h *harness) stop() {
	if h.cancel != nil {
		h.cancel()
		<-h.done
		h.cancel = nil
	}
}

func (h *harness) plug(dev string, srcs ...bundle.Source) {
	h.media.mu.Lock()
	h.media.sticks[dev] = srcs
	h.media.mu.Unlock()
	h.dev.ch <- machine.DeviceEvent{Action: "add", Device: dev, FSType: "vfat"}
}

// waitBound is how long a harness wait polls before the test fails
// instead of hanging: not a speed requirement (a busy 2-core machine
// running -race is slow), so generous.
const waitBound = 2 * time.Minute

// waitFor polls cond until it holds: what the loop does reaches the
// test a moment later. The one sleep of these tests: a poll, never a
// wait to prove that something did not happen.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("never: %s; status %+v", what, h.agent.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) waitPhase(p machine.Phase) machine.Status {
	h.t.Helper()
	var s machine.Status
	h.waitFor("phase "+string(p), func() bool { s = h.agent.Status(); return s.Phase == string(p) })
	return s
}

// waitWhy waits until the bundle's condition has the reason why.
func (h *harness) waitWhy(why string) machine.Record {
	h.t.Helper()
	var r machine.Record
	h.waitFor("reason "+why, func() bool { r = h.record(); return r.Condition.Reason == why })
	return r
}

func stick(t *testing.T, o bundletest.Options) (bundle.Source, digest.Digest) {
	p, d := bundletest.Write(t, t.TempDir(), o)
	src, err := bundle.FindSource(p, "")
	if err != nil {
		t.Fatal(err)
	}
	return src, d
}

func TestAgent_StickToLoaded(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	idle := h.agent.Status().Line // published by New
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitPhase(machine.PhaseClusterReady)
	if s.Digest != digest || s.Version != "4.13.7" {
		t.Fatalf("status %+v", s)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64", bundle.MetadataName)); err != nil {
		t.Fatal(err)
	}
	if h.media.opened() != 0 {
		t.Error("stick left mounted")
	}
	// systemd is told READY, then each phase's line: the idle one first,
	// the one of every phase passed through, the last one now.
	h.waitFor("the last line sent", func() bool { l, _ := h.lines.sent(); return l[len(l)-1] == s.Line })
	if all, ready := h.lines.sent(); !ready || len(all) < 4 || all[0] != idle {
		t.Errorf("READY %v; STATUS= lines %q, want %q first, one per phase", ready, all, idle)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.StateDir, "bundles", strings.TrimPrefix(string(digest), "sha256:")+".index")); err != nil {
		t.Errorf("tar index not kept: %v", err)
	}
}

func TestAgent_ResumesAfterRestart(t *testing.T) {
	root := t.TempDir()
	h := newHarness(t, root)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(machine.PhaseClusterReady)
	h.stop()

	h2 := newHarness(t, root)
	h2.start()
	s := h2.waitPhase(machine.PhaseClusterReady)
	h2.stop()
	if s.Digest != digest || len(h2.loader.loads) != 0 {
		t.Fatalf("after restart: %+v, %d loads", s, len(h2.loader.loads))
	}
}

func TestAgent_CleanupOfALoadedBundleIsTheUpgradeDone(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	first := bundletest.Options{Images: []string{"quay.io/a/shared", "quay.io/a/old"}}
	shared, old := bundletest.Ref("quay.io/a/shared", 0), bundletest.Ref("quay.io/a/old", 0)
	src, _ := stick(t, first)
	h.plug("/dev/sda", src)
	h.waitPhase(machine.PhaseClusterReady)
	must(t, h.agent.Request(t.Context(), "cleanup", nil))
	h.loader.mu.Lock()
	retires, cleanups := len(h.loader.retires), h.loader.cleanups
	h.loader.mu.Unlock()
	if retires != 1 || cleanups != 0 {
		t.Fatalf("retires %d, cleanups %d: want the upgrade's end (pins kept), not a cleanup", retires, cleanups)
	}
	firstDir := filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")
	if _, err := os.Stat(filepath.Join(firstDir, bundle.MetadataName)); err != nil || !h.record().Retained {
		t.Fatalf("the running release's tree is not kept: %v, retained %v", err, h.record().Retained)
	}
	if got := h.agent.Status(); got.Phase != string(machine.PhaseUpgraded) || h.record().Condition != (machine.Condition{}) || !got.Healthy {
		t.Fatalf("after cleanup %+v", got)
	}
	// The next bundle is the next upgrade, not a conflict; it loads
	// keeping the first one's pins, and its own end unpins them (except
	// the images both hold).
	next, _ := stick(t, bundletest.Options{Version: "4.13.8", Images: []string{"quay.io/a/shared"}})
	h.plug("/dev/sdb", next)
	if s := h.waitPhase(machine.PhaseClusterReady); s.Version != "4.13.8" {
		t.Fatal(s.Version)
	}
	h.loader.mu.Lock()
	keep := h.loader.keeps[len(h.loader.keeps)-1]
	h.loader.mu.Unlock()
	if !slices.Contains(keep, old) {
		t.Fatalf("the second load did not keep the first bundle's pins: %v", keep)
	}
	must(t, h.agent.Request(t.Context(), "cleanup", nil))
	if _, err := os.Stat(firstDir); !os.IsNotExist(err) {
		t.Error("the first release's kept tree outlived the next upgrade")
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.8-x86_64", bundle.MetadataName)); err != nil {
		t.Errorf("the running release's tree is not kept: %v", err)
	}
	h.loader.mu.Lock()
	defer h.loader.mu.Unlock()
	if h.loader.pinned(old) || !h.loader.pinned(shared) {
		t.Fatalf("after the second upgrade: unpinned %v, pinned %v", h.loader.unpinned, h.loader.pins)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
