package crio_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/crio/critest"
)

// fakeCRIO is an in-memory CRI-O: images by name, pins applied from the
// crio.conf.d drop-ins (last file that sets pinned_images wins) only on
// reload, and asynchronously, as CRI-O does.
type fakeCRIO struct {
	t       *testing.T
	confDir string

	mu          sync.Mutex
	present     map[string]bool
	pins        []string
	down        int // answer Unavailable to this many more calls
	failPulls   map[string][]error
	pulls       map[string]int
	inFlight    int
	maxInFlight int
	reloads     int
	applied     int  // the reload whose pins are in effect
	reloadsDown int  // reloads while not answering: a SIGHUP would kill a starting CRI-O
	livePins    bool // implement PinLister
}

func newFakeCRIO(t *testing.T, confDir string) *fakeCRIO {
	return &fakeCRIO{t: t, confDir: confDir, present: map[string]bool{}, failPulls: map[string][]error{}, pulls: map[string]int{}}
}

var errDown = fmt.Errorf("status: %w", crio.ErrUnavailable)

func (f *fakeCRIO) gate() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down > 0 {
		f.down--
		return errDown
	}
	return nil
}

func (f *fakeCRIO) Pull(ctx context.Context, ref string) (string, error) {
	if err := f.gate(); err != nil {
		return "", err
	}
	f.mu.Lock()
	f.pulls[ref]++
	if errs := f.failPulls[ref]; len(errs) > 0 {
		f.failPulls[ref] = errs[1:]
		f.mu.Unlock()
		return "", errs[0]
	}
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	f.mu.Unlock()
	time.Sleep(time.Millisecond) // let pulls overlap
	f.mu.Lock()
	f.inFlight--
	f.present[ref] = true
	f.mu.Unlock()
	return "id-" + ref, ctx.Err()
}

func (f *fakeCRIO) Status(ctx context.Context, ref string) (bool, bool, error) {
	if err := f.gate(); err != nil {
		return false, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.present[ref], f.present[ref] && pinMatch(f.pins, ref), nil
}

func (f *fakeCRIO) List(context.Context) ([]crio.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []crio.Image
	for r := range f.present {
		out = append(out, crio.Image{ID: r, RepoDigests: []string{r}, Pinned: pinMatch(f.pins, r)})
	}
	return out, nil
}

// Reload implements crio.Reloader: pins from the files, a little later.
func (f *fakeCRIO) Reload(context.Context) error {
	f.mu.Lock()
	f.reloads++
	gen := f.reloads
	if f.down > 0 {
		f.reloadsDown++
	}
	f.mu.Unlock()
	pins := effectivePins(f.t, f.confDir)
	go func() {
		time.Sleep(5 * time.Millisecond)
		f.mu.Lock()
		if gen > f.applied { // an earlier reload applied late never undoes a later one
			f.pins, f.applied = pins, gen
		}
		f.mu.Unlock()
	}()
	return nil
}

type pinLister struct{ *fakeCRIO }

func (p pinLister) PinnedImages(context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.pins), nil
}

func effectivePins(t *testing.T, dir string) []string {
	ents, _ := os.ReadDir(dir)
	names := []string{}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	var pins []string
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Error(err)
			continue
		}
		if !strings.Contains(string(b), "pinned_images") {
			continue
		}
		pins = decodePins(t, filepath.Join(dir, n))
	}
	return pins
}

// pinMatch is CRI-O's exact or trailing-* glob match.
func pinMatch(pins []string, ref string) bool {
	for _, p := range pins {
		if p == ref || strings.HasSuffix(p, "*") && strings.HasPrefix(ref, p[:len(p)-1]) {
			return true
		}
	}
	return false
}

func manyImages(n int) []string {
	out := []string{fmt.Sprintf("quay.io/openshift-release-dev/ocp-release@sha256:%064x", 1)}
	for i := 2; i <= n; i++ {
		out = append(out, fmt.Sprintf("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:%064x", i))
	}
	return append(out, fmt.Sprintf("quay.io/my-company/app:v1@sha256:%064x", n+1))
}

func newRuntime(t *testing.T) (*crio.Runtime, *fakeCRIO, dirs) {
	ds := newDirs(t)
	f := newFakeCRIO(t, ds.d.CRIOConfDir)
	return &crio.Runtime{CRI: f, Dropins: ds.d, Reloader: f, Log: testLog(t), Workers: 4,
		Backoff: time.Millisecond, Poll: time.Millisecond, PinWait: 10 * time.Second, CRIOWait: 10 * time.Second}, f, ds
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tw{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tw struct{ t *testing.T }

func (w tw) Write(b []byte) (int, error) { w.t.Log(strings.TrimSpace(string(b))); return len(b), nil }

func request(t *testing.T, images []string) crio.Request {
	return requestFor(images, "127.0.0.1:5443", testCA(t, true), "4.13.7-x86_64")
}

func TestLoad_PullsEveryImageAndEndsPinned(t *testing.T) {
	for _, live := range []bool{false, true} {
		t.Run(fmt.Sprintf("PinLister=%v", live), func(t *testing.T) {
			l, f, _ := newRuntime(t)
			if live {
				l.CRI = pinLister{f}
			}
			images := manyImages(30)
			req := request(t, images)
			var mu sync.Mutex
			var seen [][2]int
			req.Progress = func(done, total int) { mu.Lock(); seen = append(seen, [2]int{done, total}); mu.Unlock() }
			res, err := l.Load(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			refs := bundle.PullRefs(images)
			if res.Total != len(refs) || res.Pulled+res.Skipped != len(refs) || !res.Reloaded {
				t.Errorf("result %+v, want %d images and a reload", res, len(refs))
			}
			for _, r := range refs {
				if !f.present[r] || !slices.Contains(f.pins, r) {
					t.Errorf("%s present=%v pinned=%v", r, f.present[r], slices.Contains(f.pins, r))
				}
			}
			if last := seen[len(seen)-1]; last != [2]int{len(refs), len(refs)} {
				t.Errorf("last progress %v", last)
			}
			for i := 1; i < len(seen); i++ {
				if seen[i][0] < seen[i-1][0] {
					t.Errorf("progress went back: %v", seen)
				}
			}
			if f.maxInFlight > 4 {
				t.Errorf("%d pulls at once, want ≤ 4 workers", f.maxInFlight)
			}
		})
	}
}

func TestLoad_ImageAdmittedByDigestOnlyIsPulledAndPinnedWithoutItsTag(t *testing.T) {
	// The node's signature policy admits the tagged image by digest only
	// (imagepolicy): the agent hands its images with that tag dropped.
	l, f, ds := newRuntime(t)
	images := manyImages(3)
	tagged := images[len(images)-1] // quay.io/my-company/app:v1@sha256:…
	name, tag, digest := bundle.SplitRef(tagged)
	if _, err := l.Load(t.Context(), request(t, bundle.DropTags(images, []string{tagged}))); err != nil {
		t.Fatal(err)
	}
	if f.pulls[name+":"+tag] != 0 || f.present[name+":"+tag] {
		t.Errorf("the tag %s:%s was pulled", name, tag)
	}
	if f.pulls[name+"@"+digest] != 1 || !pinMatch(f.pins, name+"@"+digest) {
		t.Errorf("%s@%s pulled %d times, pinned %v; want once, pinned", name, digest, f.pulls[name+"@"+digest], pinMatch(f.pins, name+"@"+digest))
	}
	if pins := decodePins(t, filepath.Join(ds.d.CRIOConfDir, crio.DropinName)); slices.Contains(pins, name+":"+tag) {
		t.Errorf("pins %q hold the dropped tag", pins)
	}
	b, err := os.ReadFile(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName))
	if err != nil {
		t.Fatal(err)
	}
	if e := readEntries(t, b)[name]; len(e.Mirror) == 0 || e.Mirror[0].PullFromMirror != "digest-only" {
		t.Errorf("mirror of %s: %+v, want digest-only: its one image lost its tag", name, e)
	}
}

func TestLoad_AgainSkipsPresentPinnedAndDoesNotReload(t *testing.T) {
	l, f, _ := newRuntime(t)
	req := request(t, manyImages(10))
	if _, err := l.Load(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	res, err := l.Load(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reloaded || res.Pulled != 0 || res.Skipped != res.Total || f.reloads != 1 {
		t.Errorf("second load %+v after %d reloads, want no reload and everything skipped", res, f.reloads)
	}
}

func TestLoad_RetriesTransientPullErrors(t *testing.T) {
	l, f, _ := newRuntime(t)
	images := manyImages(5)
	ref := bundle.PullRefs(images)[2]
	f.failPulls[ref] = []error{status.Error(codes.Unknown, "pinging container registry: connection reset"), status.Error(codes.Unknown, "EOF")}
	if _, err := l.Load(t.Context(), request(t, images)); err != nil {
		t.Fatal(err)
	}
	if f.pulls[ref] != 3 {
		t.Errorf("%d pulls of %s, want 3", f.pulls[ref], ref)
	}
}

func TestLoad_FailsNamingImagesThatNeverPull(t *testing.T) {
	l, f, _ := newRuntime(t)
	l.Attempts = 3
	images := manyImages(5)
	bad := []string{bundle.PullRefs(images)[1], bundle.PullRefs(images)[3]}
	for _, r := range bad {
		for range 10 {
			f.failPulls[r] = append(f.failPulls[r], status.Error(codes.Unknown, "pinging container registry 127.0.0.1:5443: connection refused"))
		}
	}
	_, err := l.Load(t.Context(), request(t, images))
	if !errors.Is(err, crio.ErrNotLoaded) {
		t.Fatalf("got %v, want ErrNotLoaded", err)
	}
	for _, r := range bad {
		if !strings.Contains(err.Error(), r) {
			t.Errorf("error does not name %s: %v", r, err)
		}
		if f.pulls[r] != 3 {
			t.Errorf("%d pulls of %s, want 3 attempts", f.pulls[r], r)
		}
	}
}

func TestLoad_InvalidArgumentIsNotRetried(t *testing.T) {
	l, f, _ := newRuntime(t)
	images := manyImages(3)
	r := bundle.PullRefs(images)[0]
	f.failPulls[r] = []error{status.Error(codes.InvalidArgument, "bad ref"), nil}
	if _, err := l.Load(t.Context(), request(t, images)); !errors.Is(err, crio.ErrNotLoaded) {
		t.Fatalf("got %v, want ErrNotLoaded", err)
	}
	if f.pulls[r] != 1 {
		t.Errorf("%d pulls, want 1", f.pulls[r])
	}
}

func TestLoad_WaitsForCRIOToComeBack(t *testing.T) {
	l, f, _ := newRuntime(t)
	f.down = 40 // spread over reload probe, pulls and status calls
	if _, err := l.Load(t.Context(), request(t, manyImages(12))); err != nil {
		t.Fatal(err)
	}
	if f.down != 0 {
		t.Errorf("%d unavailable answers unused", f.down)
	}
}

// A CRI-O that is starting (its pid known, its socket not yet answering)
// dies of a SIGHUP: the loader reloads only a CRI-O that answers.
func TestLoad_ReloadsOnlyACRIOThatAnswers(t *testing.T) {
	l, f, _ := newRuntime(t)
	f.down = 6
	if _, err := l.Load(t.Context(), request(t, manyImages(3))); err != nil {
		t.Fatal(err)
	}
	if f.reloads != 1 || f.reloadsDown != 0 {
		t.Errorf("%d reloads, %d of them while CRI-O was not answering; want 1, 0", f.reloads, f.reloadsDown)
	}
}

func TestLoad_GivesUpWhenCRIOStaysDown(t *testing.T) {
	l, f, _ := newRuntime(t)
	l.CRIOWait = 300 * time.Millisecond
	f.down = 1 << 30
	_, err := l.Load(t.Context(), request(t, manyImages(4)))
	if !errors.Is(err, crio.ErrUnavailable) {
		t.Fatalf("got %v, want ErrUnavailable", err)
	}
	t.Log(err)
}

func TestLoad_ReportsPinsNotApplied(t *testing.T) {
	for _, live := range []bool{false, true} {
		t.Run(fmt.Sprintf("PinLister=%v", live), func(t *testing.T) {
			l, f, _ := newRuntime(t)
			l.Reloader = crio.NoReload{} // the reload never reaches CRI-O
			l.PinWait = 200 * time.Millisecond
			want := crio.ErrNotLoaded
			if live {
				l.CRI, want = pinLister{f}, crio.ErrNotApplied
			}
			_, err := l.Load(t.Context(), request(t, manyImages(3)))
			if !errors.Is(err, want) {
				t.Fatalf("got %v, want %v", err, want)
			}
			t.Log(err)
		})
	}
}

type failingReloader struct{ err error }

func (r failingReloader) Reload(context.Context) error { return r.err }

func TestLoad_ReloadErrorWithCRIOUpFailsAtOnce(t *testing.T) {
	l, _, _ := newRuntime(t)
	l.Reloader = failingReloader{errors.New("unit reload failed: crio.service: job failed")}
	_, err := l.Load(t.Context(), request(t, manyImages(3)))
	if err == nil || !strings.Contains(err.Error(), "job failed") {
		t.Fatalf("got %v", err)
	}
}

func TestLoad_ContextCancelStops(t *testing.T) {
	l, _, _ := newRuntime(t)
	ctx, cancel := context.WithCancel(t.Context())
	req := request(t, manyImages(50))
	req.Progress = func(done, total int) {
		if done == 5 {
			cancel()
		}
	}
	if _, err := l.Load(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestUnload_UnpinsBundleButKeepsOtherDropinsPins(t *testing.T) {
	l, f, ds := newRuntime(t)
	images := manyImages(6)
	refs := bundle.PullRefs(images)
	ds.write(t, "crio/crio.conf.d/50-pinned-images", "[crio.image]\npinned_images = [\""+refs[2]+"\", \"quay.io/my-company/*\"]\n")
	req := request(t, images)
	if _, err := l.Load(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if err := l.Unload(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		keep := r == refs[2] || strings.HasPrefix(r, "quay.io/my-company/")
		if got := pinMatch(f.pins, r); got != keep {
			t.Errorf("%s pinned=%v after unload, want %v", r, got, keep)
		}
	}
	if _, err := os.Stat(filepath.Join(ds.d.CRIOConfDir, crio.DropinName)); err == nil {
		t.Error("pin drop-in left behind")
	}
}

func TestSignalReloader_RefusesStaleOrMissingPid(t *testing.T) {
	dir := t.TempDir()
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Process.Kill()
	for name, content := range map[string]*string{
		"missing pid file":   nil,
		"garbage":            ptr("x\n"),
		"pid of another prg": ptr(fmt.Sprint(sleep.Process.Pid)),
		"dead pid":           ptr("999999999"),
	} {
		t.Run(name, func(t *testing.T) {
			pf := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
			if content != nil {
				os.WriteFile(pf, []byte(*content), 0o644)
			}
			err := crio.SignalReloader{PidFile: pf}.Reload(t.Context())
			if !errors.Is(err, crio.ErrNotRunning) {
				t.Fatalf("got %v, want ErrNotRunning", err)
			}
		})
	}
	if err := sleep.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the unrelated process was signalled: %v", err)
	}
}

func TestSignalReloader_SendsSIGHUPToCrio(t *testing.T) {
	// A copy of sleep named crio: it dies of the SIGHUP it does not handle.
	bin := filepath.Join(t.TempDir(), "crio")
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	b, _ := os.ReadFile(src)
	os.WriteFile(bin, b, 0o755)
	// A SIGHUP ignored here (a run under nohup) stays ignored across exec:
	// catching it makes the child start with the default, fatal action.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pf := filepath.Join(t.TempDir(), "crio.pid")
	os.WriteFile(pf, []byte(fmt.Sprintln(cmd.Process.Pid)), 0o644)
	if err := (crio.SignalReloader{PidFile: pf}).Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGHUP {
		t.Fatalf("process ended with %v, want killed by SIGHUP", err)
	}
}

func ptr[T any](v T) *T { return &v }

// vanishing drops an image right after its first pull, as CRI-O's storage
// repair after an unclean stop may.
type vanishing struct {
	*fakeCRIO
	ref  string
	once sync.Once
}

func (v *vanishing) Pull(ctx context.Context, ref string) (string, error) {
	id, err := v.fakeCRIO.Pull(ctx, ref)
	if ref == v.ref {
		v.once.Do(func() { v.mu.Lock(); delete(v.present, ref); v.mu.Unlock() })
	}
	return id, err
}

func TestLoad_PullsAgainAnImageThatVanished(t *testing.T) {
	l, f, _ := newRuntime(t)
	images := manyImages(4)
	ref := bundle.PullRefs(images)[1]
	l.CRI = &vanishing{fakeCRIO: f, ref: ref}
	if _, err := l.Load(t.Context(), request(t, images)); err != nil {
		t.Fatal(err)
	}
	if f.pulls[ref] != 2 || !f.present[ref] {
		t.Errorf("%s pulled %d times, present %v; want pulled again", ref, f.pulls[ref], f.present[ref])
	}
}

func TestLoad_ReloadsWhenUnchangedFilesAreNotInEffect(t *testing.T) {
	l, f, _ := newRuntime(t)
	l.CRI = pinLister{f}
	req := request(t, manyImages(3))
	// An earlier run wrote the files and stopped before reloading.
	if _, err := l.Dropins.Apply(req); err != nil {
		t.Fatal(err)
	}
	res, err := l.Load(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Reloaded || f.reloads != 1 {
		t.Errorf("result %+v after %d reloads, want one reload", res, f.reloads)
	}
}

// The runtime's in-memory CRI-O is held to the same suite as the real one
// (test/crio) and the gRPC fake: what the runtime tests assume of it, a
// real CRI-O does.
func TestFakeCRIO_ConformsToTheImageServiceSuite(t *testing.T) {
	f := newFakeCRIO(t, t.TempDir())
	f.failPulls[refX] = []error{errors.New("manifest unknown"), errors.New("manifest unknown")}
	critest.RunImageServiceSuite(t, f, critest.Env{
		Pullable: []string{refA, refB},
		Absent:   refX,
		Pin: func(t *testing.T, refs ...string) {
			f.mu.Lock()
			f.pins = refs
			f.mu.Unlock()
		},
	})
}

func TestLoad_APullThatCannotHealIsPermanentAndNamesTheImages(t *testing.T) {
	l, f, _ := newRuntime(t)
	images := manyImages(5)
	broken := images[2]
	f.failPulls[broken] = []error{
		status.Error(codes.NotFound, "initializing source docker://"+broken+": reading manifest in 127.0.0.1:5443/x: manifest unknown"),
		status.Error(codes.NotFound, "manifest unknown"), status.Error(codes.NotFound, "manifest unknown"), status.Error(codes.NotFound, "manifest unknown"),
	}
	_, err := l.Load(t.Context(), request(t, images))
	var p interface{ Permanent() bool }
	if !errors.As(err, &p) || !p.Permanent() || !strings.Contains(err.Error(), broken) || !errors.Is(err, crio.ErrNotLoaded) {
		t.Fatalf("got %v, want a permanent error naming %s", err, broken)
	}
	f.mu.Lock()
	tries := f.pulls[broken]
	f.mu.Unlock()
	if tries != 1 {
		t.Errorf("a manifest the bundle lacks was pulled %d times, want once", tries)
	}
}

func TestLoad_ATransientPullFailureIsNotPermanent(t *testing.T) {
	l, f, _ := newRuntime(t)
	l.Attempts = 2
	images := manyImages(3)
	f.failPulls[images[1]] = []error{errors.New("connection reset by peer"), errors.New("connection reset by peer")}
	_, err := l.Load(t.Context(), request(t, images))
	var p interface{ Permanent() bool }
	if err == nil || errors.As(err, &p) {
		t.Fatalf("got %v, want a failure that may heal", err)
	}
}

// A pull the node's signature policy rejects is permanent, and the error
// points at the policy, not at the bundle.
func TestLoad_ARejectedImageIsPermanentAndPointsAtThePolicy(t *testing.T) {
	l, f, _ := newRuntime(t)
	images := manyImages(3)
	ref := bundle.PullRefs(images)[1]
	f.failPulls[ref] = []error{&crio.CRIError{Op: "pull " + ref, Code: codes.Unknown,
		Msg: "Source image rejected: A signature was required, but no signature exists", Kind: crio.ErrImageRejected}}
	_, err := l.Load(t.Context(), request(t, images))
	var p interface{ Permanent() bool }
	if !errors.As(err, &p) || !p.Permanent() || !strings.Contains(err.Error(), "signature policy (policy.json)") {
		t.Fatalf("got %v, want a permanent error pointing at policy.json", err)
	}
}
