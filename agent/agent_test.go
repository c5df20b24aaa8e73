package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/imagepolicy"
	"github.com/ferry-edge/ferry/internal/imagetree"
	"github.com/ferry-edge/ferry/peer"
)

// fakeDevices is a DeviceSource the test feeds.
type fakeDevices struct{ ch chan DeviceEvent }

func (f *fakeDevices) Events(ctx context.Context) (<-chan DeviceEvent, error) { return f.ch, nil }

// fakeMedia maps a device to the bundles on it.
type fakeMedia struct {
	mu     sync.Mutex
	sticks map[string][]bundle.Source
	open   int
}

func (f *fakeMedia) Open(_ context.Context, ev DeviceEvent) (Medium, error) {
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

// seen polls briefly: the line follows the state by a moment.
func (l *lines) seen(sub string) bool {
	for range 200 {
		l.mu.Lock()
		for _, s := range l.all {
			if strings.Contains(s, sub) {
				l.mu.Unlock()
				return true
			}
		}
		l.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	return false
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
}

func newHarness(t *testing.T, root string) *harness {
	cfg := DefaultConfig()
	cfg.NodeName = "node-a"
	cfg.Arch = "x86_64"
	cfg.Approval = "off" // most tests are about something else; approval's own tests set it back
	cfg.Paths.StateDir = filepath.Join(root, "state")
	cfg.Paths.ExtractDir = filepath.Join(root, "upgrade")
	h := &harness{t: t, cfg: cfg, dev: &fakeDevices{ch: make(chan DeviceEvent)},
		media: &fakeMedia{sticks: map[string][]bundle.Source{}}, loader: &fakeLoader{}, lines: &lines{}}
	return h
}

func (h *harness) start() {
	h.t.Helper()
	clock := time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)
	var api ClusterAPI
	if h.api != nil {
		api = h.api
	}
	a, err := New(h.cfg, Deps{Devices: h.dev, Media: h.media, Loader: h.loader, Notify: h.lines, Peers: h.peers,
		API: api, APIPoll: 20 * time.Millisecond, PeerPoll: 50 * time.Millisecond, RetryBase: 10 * time.Millisecond, Now: func() time.Time { return clock }, Admit: h.admit,
		Puller: h.puller})
	if err != nil {
		h.t.Fatal(err)
	}
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
	h.dev.ch <- DeviceEvent{Action: "add", Device: dev, FSType: "vfat"}
}

// waitBound is how long a harness wait polls before the test fails
// instead of hanging: not a speed requirement (a busy 2-core machine
// running -race is slow), so generous.
const waitBound = 2 * time.Minute

func (h *harness) waitPhase(p Phase) Status {
	h.t.Helper()
	deadline := time.Now().Add(waitBound)
	for time.Now().Before(deadline) {
		if s := h.agent.Status(); s.Phase == string(p) {
			return s
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("phase %s never reached; status %+v", p, h.agent.Status())
	return Status{}
}

func (h *harness) waitReason(sub string) Status {
	h.t.Helper()
	deadline := time.Now().Add(waitBound)
	for time.Now().Before(deadline) {
		if s := h.agent.Status(); strings.Contains(s.Reason, sub) {
			return s
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("reason %q never seen; status %+v", sub, h.agent.Status())
	return Status{}
}

func stick(t *testing.T, o bundletest.Options) (bundle.Source, string) {
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
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseClusterReady)
	if s.Digest != digest || s.Version != "4.13.7" {
		t.Fatalf("status %+v", s)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64", bundle.MetadataName)); err != nil {
		t.Fatal(err)
	}
	if h.media.opened() != 0 {
		t.Error("stick left mounted")
	}
	for _, want := range []string{"waiting for an upgrade stick", "extracted upgrade-4.13.7-x86_64.tar", "cluster-ready 4.13.7"} {
		if !h.lines.seen(want) {
			t.Errorf("no status line with %q", want)
		}
	}
	h.lines.mu.Lock()
	ready := h.lines.ready
	h.lines.mu.Unlock()
	if !ready {
		t.Error("READY never sent")
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.StateDir, "bundles", strings.TrimPrefix(digest, "sha256:")+".index")); err != nil {
		t.Errorf("tar index not kept: %v", err)
	}
}

func TestAgent_ImageTheNodesPolicyAdmitsByDigestOnlyIsLoadedWithoutItsTag(t *testing.T) {
	// The node's policy.json wants a sigstore signature under
	// matchRepoDigestOrExact; the app's names another tag of the same
	// manifest: by digest it passes, by its tag 1.0 it does not.
	key, pub := imagetree.NewSigningKey()
	dir := t.TempDir()
	keyPath, policyPath := filepath.Join(dir, "app.pub"), filepath.Join(dir, "policy.json")
	must(t, os.WriteFile(keyPath, pub, 0o644))
	must(t, os.WriteFile(policyPath, []byte(`{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  "quay.io/team/app":[{"type":"sigstoreSigned","keyPath":"`+keyPath+`","signedIdentity":{"type":"matchRepoDigestOrExact"}}]}}}`), 0o644))
	app := bundletest.Ref("quay.io/team/app:1.0", 0)
	h := newHarness(t, t.TempDir())
	h.admit = imagepolicy.Checker{Path: policyPath}.Admit
	h.start()
	src, _ := stick(t, bundletest.Options{Images: []string{"quay.io/team/app:1.0"}, SignKey: key, SignAll: true,
		SignIdentity: func(ref string) string {
			if ref == app {
				return "quay.io/team/app:2.0"
			}
			return ""
		}})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseClusterReady)
	h.stop()
	name, _, digest := bundle.SplitRef(app)
	if len(h.loader.images) != 1 || !slices.Contains(h.loader.images[0], name+"@"+digest) || slices.Contains(h.loader.images[0], app) {
		t.Fatalf("loaded %q, want %s by digest only", h.loader.images, app)
	}
	if refs := bundle.PullRefs(h.loader.images[0]); slices.Contains(refs, "quay.io/team/app:1.0") || !slices.Contains(refs, name+"@"+digest) {
		t.Errorf("pulls %q: want the digest and not the tag", refs)
	}
	if len(s.SignaturePolicy) != 1 || !strings.Contains(s.SignaturePolicy[0], "quay.io/team/app:1.0 is loaded by digest only") ||
		!strings.Contains(s.SignaturePolicy[0], "so the tag 1.0 is not loaded") {
		t.Errorf("status warnings %q, want the tag dropped said", s.SignaturePolicy)
	}
	if len(s.Bundles) != 1 || !slices.Equal(s.Bundles[0].DigestOnly, []string{app}) {
		t.Errorf("record %+v, want %s by digest only kept", s.Bundles, app)
	}
}

func TestAgent_SameBundleTwiceIsNotProcessedAgain(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	second, _ := stick(t, bundletest.Options{}) // a copy on another stick
	h.plug("/dev/sdb", second)
	h.plug("/dev/sdb", second) // and a stray change event
	h.waitPhase(PhaseClusterReady)
	h.stop()
	if n := len(h.loader.loads); n != 1 {
		t.Fatalf("loaded %d times", n)
	}
}

func TestAgent_DifferentSecondBundleIsAConflict(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	other, _ := stick(t, bundletest.Options{Version: "4.13.8"})
	h.plug("/dev/sdb", other)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(h.agent.Status().Error, "conflict") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	s := h.agent.Status()
	if s.Phase != string(PhaseClusterReady) || s.Digest != digest || !strings.Contains(s.Error, "upgrade-4.13.8-x86_64.tar differs") {
		t.Fatalf("status %+v", s)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.8-x86_64")); !os.IsNotExist(err) {
		t.Fatal("the conflicting bundle was extracted")
	}
}

// The default (approval = "required", nothing approved): a stick's
// bundle is verified, extracted and shared, never loaded; it waits,
// saying how to approve it. Once the config approves its digest (and
// ferry restarts), it loads with no new plug.
func TestAgent_AnUnapprovedBundleIsExtractedButWaitsForApproval(t *testing.T) {
	for _, tc := range []struct {
		name     string
		approved []string
	}{
		{"nothing configured", nil},
		{"another digest approved", []string{"sha256:" + strings.Repeat("0", 64)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, t.TempDir())
			h.cfg.Approval = "required"
			h.cfg.ApprovedDigests = tc.approved
			h.start()
			src, digest := stick(t, bundletest.Options{})
			h.plug("/dev/sda", src)
			s := h.waitReason("waiting for approval")
			if s.Phase != string(PhaseExtracted) || !strings.Contains(s.Line, digest) || !strings.Contains(s.Line, "approved_digests") || s.ApprovalOff {
				t.Fatalf("status %+v", s)
			}
			// The step that made it wait started no load (the reducer's
			// table: "extracted unapproved: it waits for approval").
			if h.loads() != 0 {
				t.Fatal("an unapproved bundle was loaded")
			}
			if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64", bundle.MetadataName)); err != nil {
				t.Fatalf("not extracted: %v", err)
			}
			h.stop()

			h2 := newHarness(t, filepath.Dir(h.cfg.Paths.StateDir))
			h2.cfg = h.cfg
			h2.cfg.ApprovedDigests = append(slices.Clone(tc.approved), digest)
			h2.loader = h.loader
			h2.start()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				s := h2.agent.Status()
				if Phase(s.Phase).Loaded() && s.Digest == digest {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not loaded once approved: %+v", s)
				}
			}
		})
	}
}

// approval = "off" is loud: the status line says it.
func TestAgent_ApprovalOffIsShownInTheStatus(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	if s := h.agent.Status(); !s.ApprovalOff || !strings.Contains(s.Line, "approval is off") {
		t.Fatalf("status %+v", s)
	}
}

func TestAgent_WrongArchRefused(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	src, _ := stick(t, bundletest.Options{Arch: "aarch64"})
	h.plug("/dev/sda", src)
	s := h.waitPhase(PhaseRejected)
	if !strings.Contains(s.Reason, "aarch64") {
		t.Fatalf("reason %q", s.Reason)
	}
}

func TestAgent_ResumesAfterRestart(t *testing.T) {
	root := t.TempDir()
	h := newHarness(t, root)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	h.stop()

	h2 := newHarness(t, root)
	h2.start()
	s := h2.waitPhase(PhaseClusterReady)
	h2.stop()
	if s.Digest != digest || len(h2.loader.loads) != 0 {
		t.Fatalf("after restart: %+v, %d loads", s, len(h2.loader.loads))
	}
}

func TestAgent_InterruptedExtractionIsRedoneFromTheStick(t *testing.T) {
	root := t.TempDir()
	h := newHarness(t, root)
	src, digest := stick(t, bundletest.Options{})
	// State as a crash mid-extraction leaves it: record "detected", a
	// staging dir and even a published dir that was never recorded.
	store, err := OpenStore(h.cfg.Paths.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")
	os.MkdirAll(bundle.StagingDir(dir), 0o755)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o644)
	must(t, store.Save(&Record{ID: strings.TrimPrefix(digest, "sha256:"), Digest: digest, Name: src.Name(),
		Origin: "stick", Source: "/dev/sda", Dir: dir, Phase: PhaseDetected, Times: map[Phase]time.Time{}}))
	h.start()
	s := h.waitReason("plug the stick in again")
	if s.Phase != string(PhaseDetected) || !strings.Contains(s.Line, "plug the stick in again") {
		t.Fatalf("line %q", s.Line)
	}
	if _, err := os.Stat(filepath.Join(dir, "half")); !os.IsNotExist(err) {
		t.Fatal("an unrecorded extracted dir was kept")
	}
	if _, err := os.Stat(bundle.StagingDir(dir)); !os.IsNotExist(err) {
		t.Fatal("staging dir kept")
	}
	h.plug("/dev/sda", src)
	s = h.waitPhase(PhaseClusterReady)
	if s.Digest != digest {
		t.Fatal(s.Digest)
	}
}

func TestAgent_LoadFailureIsRetried(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.loader.fail = 1
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(h.agent.Status().Reason, "crio is down") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s := h.agent.Status(); s.Phase != string(PhaseLoading) || !strings.Contains(s.Line, "retrying") {
		t.Fatalf("status %+v", s)
	}
	// The retry timer fires after the backoff (5 s); the test waits for it.
	deadline = time.Now().Add(15 * time.Second)
	for h.agent.Status().Phase != string(PhaseClusterReady) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if h.agent.Status().Phase != string(PhaseClusterReady) {
		t.Fatal("never loaded after the retry")
	}
}

func TestAgent_CleanupOfALoadedBundleIsTheUpgradeDone(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.start()
	first := bundletest.Options{Images: []string{"quay.io/a/shared", "quay.io/a/old"}}
	shared, old := bundletest.Ref("quay.io/a/shared", 0), bundletest.Ref("quay.io/a/old", 0)
	src, _ := stick(t, first)
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
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
	if got := h.agent.Status(); got.Phase != string(PhaseUpgraded) || !strings.Contains(got.Line, "waiting for the next upgrade stick") || !got.Healthy {
		t.Fatalf("after cleanup %+v", got)
	}
	// The next bundle is the next upgrade, not a conflict; it loads
	// keeping the first one's pins, and its own end unpins them (except
	// the images both hold).
	next, _ := stick(t, bundletest.Options{Version: "4.13.8", Images: []string{"quay.io/a/shared"}})
	h.plug("/dev/sdb", next)
	if s := h.waitPhase(PhaseClusterReady); s.Version != "4.13.8" {
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

func TestAgent_CleanupBeforeLoadingTakesTheBundleOut(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.peers = newFakePeers()
	h.cfg.Peer.Peers = []string{"10.0.0.2:8090"} // never answers: the bundle stays extracted
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseExtracted)
	must(t, h.agent.Request(t.Context(), "cleanup", nil))
	if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); !os.IsNotExist(err) {
		t.Fatal("extracted dir kept")
	}
	if got := h.agent.Status(); got.Phase != "idle" {
		t.Fatalf("after cleanup %+v", got)
	}
	next, _ := stick(t, bundletest.Options{Version: "4.13.8"})
	h.plug("/dev/sdb", next)
	if s := h.waitPhase(PhaseExtracted); s.Version != "4.13.8" {
		t.Fatal(s.Version)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// No room for a stick's bundle and its load: refused before a byte is
// written, saying so and what to do after freeing space; a peer's bundle
// is not fetched, and the fetch is retried (space may be freed), the room
// asked for counting its tar and its tree; a fetched bundle with no room
// left to extract it (the disk filled meanwhile) is fetched again, not
// refused for good.
func TestAgent_NoRoomRefusesBeforeWriting(t *testing.T) {
	noRoom := fmt.Errorf("%w in /var: writing the bundle (1 GiB) and loading the 1 images CRI-O does not hold needs 3 GiB; free 2 GiB there", bundle.ErrNoSpace)
	t.Run("a stick", func(t *testing.T) {
		h := newHarness(t, t.TempDir())
		h.loader.room = noRoom
		h.start()
		src, _ := stick(t, bundletest.Options{})
		h.plug("/dev/sda", src)
		s := h.waitPhase(PhaseRejected)
		if !strings.Contains(s.Reason, "free 2 GiB there; then plug the stick in again") {
			t.Fatal(s.Reason)
		}
		if ents, _ := os.ReadDir(h.cfg.Paths.ExtractDir); len(ents) != 0 {
			t.Fatalf("wrote %s", ents[0].Name())
		}
	})
	for _, tc := range []struct {
		name   string
		serial bool
		// state is the room asked for in the state dir, given the tree's.
		state func(tree int64) int64
		what  string
	}{
		{name: "a peer's bundle, fetched whole (serial)", serial: true, state: func(tree int64) int64 { return tree }, what: "the tar"},
		{name: "a peer's bundle, cut-through: its tree and a window", state: peer.StreamWindow, what: "the window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, p := clusterHarness(t)
			h.cfg.Peer.Serial = tc.serial
			var asked map[string]int64
			h.loader.roomFor = func(w map[string]int64) error { asked = w; return noRoom }
			tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
			p.offer(t, "10.0.0.2:8090", tarPath, digest)
			h.start()
			s := h.waitReason("free 2 GiB there; then it is fetched by itself")
			if s.Phase != string(PhaseFetching) {
				t.Fatalf("%+v", s)
			}
			h.loader.mu.Lock()
			tree := asked[h.cfg.Paths.ExtractDir]
			if len(asked) != 2 || tree <= 0 || asked[h.cfg.Paths.StateDir] != tc.state(tree) {
				t.Errorf("room asked for %v: want %s (%d) in %s and the tree in %s", asked, tc.what, tc.state(tree), h.cfg.Paths.StateDir, h.cfg.Paths.ExtractDir)
			}
			h.loader.mu.Unlock()
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.fetched != 0 {
				t.Fatal("fetched without room")
			}
		})
	}
	t.Run("a fetched bundle, the disk filled meanwhile", func(t *testing.T) {
		h, p := clusterHarness(t)
		h.cfg.Peer.Serial = true // the extraction's own check comes after a whole fetch
		h.loader.roomFor = func(w map[string]int64) error {
			if len(w) == 1 { // the extraction
				return noRoom
			}
			return nil
		}
		tarPath, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
		p.set("10.0.0.2:8090", peer.Status{Node: "b", Phase: "extracted", Digest: digest})
		p.offer(t, "10.0.0.2:8090", tarPath, digest)
		h.start()
		s := h.waitReason("no room to extract the fetched bundle, fetching it again once there is")
		if s.Phase != string(PhaseFetching) || !strings.Contains(s.Reason, "free 2 GiB there") {
			t.Fatalf("%+v", s)
		}
		if ents, _ := os.ReadDir(filepath.Join(h.cfg.Paths.StateDir, "incoming")); len(ents) != 0 {
			t.Errorf("the tar was kept: %s", ents[0].Name())
		}
		// Space freed; the retry (here: the restart) fetches and loads it.
		h.stop()
		h.loader.mu.Lock()
		h.loader.roomFor = nil
		h.loader.mu.Unlock()
		h.start()
		if s := h.waitPhase(PhaseLoaded); s.Digest != digest {
			t.Fatal(s.Digest)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.fetched != 2 {
			t.Errorf("fetched %d times, want 2", p.fetched)
		}
	})
}

// A stick whose bundle its files make unreadable (Refused: a link, a
// FIFO) is rejected with that reason and nothing opened; what a stick
// controls (its file names, in the reason) leaves the node as one
// bounded line, and the device is probed again when plugged again.
func TestAgent_RefusedStickFileIsRejectedWithASanitisedReason(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.api = newFakeAPI()
	h.start()
	evil := "upgrade-1.0-x86_64.sha256\nSTATUS=all good\x1b[2J" + strings.Repeat("x", 2*MaxReason)
	why := fmt.Errorf("unsafe file on the stick: %s: it is a symbolic link: copy the file itself onto the stick", evil)
	h.plug("/dev/sda", bundle.Source{Path: "", Label: "/run/ferry/media/sda-1/upgrade-1.0-x86_64.tar", Refused: why})
	s := h.waitPhase(PhaseRejected)
	if !strings.Contains(s.Line, "rejected upgrade-1.0-x86_64.tar: unsafe file on the stick") {
		t.Fatalf("status line %q", s.Line)
	}
	for what, v := range map[string]string{"reason": s.Reason, "line": s.Line, "peer error": h.agent.PeerStatus().Error} {
		if strings.ContainsAny(v, "\n\x1b") || len(v) > 2*MaxReason {
			t.Errorf("%s not sanitised: %q", what, v)
		}
	}
	if len(s.Reason) > MaxReason || !strings.Contains(s.Reason, "…") || !strings.HasSuffix(s.Reason, "copy the file itself onto the stick") {
		t.Errorf("reason not bounded: %d bytes", len(s.Reason))
	}
	if !h.lines.seen("unsafe file on the stick") {
		t.Fatal("no STATUS= line says why")
	}
	h.lines.mu.Lock()
	for _, l := range h.lines.all {
		if strings.ContainsAny(l, "\n\x1b") {
			t.Errorf("STATUS= line %q holds a newline or a control character", l)
		}
	}
	h.lines.mu.Unlock()
	var ann string
	for range 2000 {
		if ann = h.api.annotation("node-a", AnnotationReason); strings.Contains(ann, "unsafe file") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(ann, "unsafe file") || strings.ContainsAny(ann, "\n\x1b") || len(ann) > MaxReason {
		t.Errorf("annotation %q: want the reason, sanitised", ann)
	}

	// The slot is not stuck: a good stick in it is read.
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	for range 2000 {
		if s := h.agent.Status(); s.Bundle == "upgrade-4.13.7-x86_64.tar" && s.Digest != "" {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the good stick plugged next was not read: %+v", h.agent.Status())
}
