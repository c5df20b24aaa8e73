package pull_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/test/fixture"
)

func TestWindow_OpenAndNextChange(t *testing.T) {
	at := func(h, m int) time.Time { return time.Date(2026, 11, 27, h, m, 0, 0, time.Local) }
	for _, tc := range []struct {
		window string
		now    time.Time
		open   bool
		change time.Time
	}{
		{"22:00-06:00", at(23, 0), true, at(30, 0)}, // 06:00 tomorrow
		{"22:00-06:00", at(3, 0), true, at(6, 0)},
		{"22:00-06:00", at(12, 0), false, at(22, 0)},
		{"09:00-17:30", at(8, 59), false, at(9, 0)},
		{"09:00-17:30", at(17, 30), false, at(33, 0)}, // 09:00 tomorrow
		{"09:00-17:30", at(10, 0), true, at(17, 30)},
		{"", at(12, 0), true, time.Time{}},
	} {
		w, err := pull.ParseWindow(tc.window)
		if err != nil {
			t.Fatal(err)
		}
		open, change := w.State(tc.now)
		if open != tc.open || !change.Equal(tc.change) {
			t.Errorf("%q at %s: open %v until %s, want %v until %s", tc.window, tc.now.Format("15:04"), open, change, tc.open, tc.change)
		}
	}
	for _, bad := range []string{"22:00", "25:00-01:00", "10:00-10:00", "ab:cd-01:00", "10:60-11:00"} {
		if _, err := pull.ParseWindow(bad); err == nil {
			t.Errorf("window %q accepted", bad)
		}
	}
}

func TestRequest_ReleaseByDigestOnly(t *testing.T) {
	ok := pull.Request{Release: "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("a", 64), Extras: []string{"quay.io/my/app:v1"}}
	if err := pull.Check(ok); err != nil {
		t.Fatal(err)
	}
	for _, r := range []pull.Request{
		{Release: "quay.io/openshift-release-dev/ocp-release:4.13.7"},
		{Release: ok.Release, Extras: []string{"Not A Reference"}},
		{Release: ok.Release, RateLimit: "fast"},
		{Release: ok.Release, Window: "nights"},
	} {
		if err := pull.Check(r); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
}

// harness is a Puller on a test registry, delivering to a fake agent.
type harness struct {
	p         *pull.Puller
	dir       string
	mu        sync.Mutex
	delivered []*create.Result
	hold      bool // the agent holds what it was given
}

func newHarness(t *testing.T, reg *fixture.Registry, o pull.Options) *harness {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	h := &harness{dir: o.Dir, hold: true}
	o.Arch = "x86_64"
	if o.Mirrors == nil {
		m, err := create.ParseMirror(reg.Mirror())
		if err != nil {
			t.Fatal(err)
		}
		o.Mirrors = func() ([]create.Mirror, error) { return []create.Mirror{m}, nil }
	}
	if o.Transport == nil {
		o.Transport = func() (http.RoundTripper, error) { return create.NewTransport(reg.CertsDir, true) }
	}
	o.Deliver = func(_ context.Context, res *create.Result) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.delivered = append(h.delivered, res)
		return nil
	}
	o.Delivered = func(digest.Digest) (bool, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.hold, nil
	}
	var err error
	if h.p, err = pull.New(o); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (h *harness) wait(t *testing.T, what string, cond func(*pull.Status) bool) *pull.Status {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if s := h.p.Status(); s != nil && cond(s) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; status %+v", what, h.p.Status())
	return nil
}

// A registry that cannot be reached is reported, with each failure
// counted and the next try shown, never retried in silence.
func TestPuller_AnUnreachableRegistryIsReportedAndRetried(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 1})
	h := newHarness(t, reg, pull.Options{Backoff: 50 * time.Millisecond,
		Mirrors: func() ([]create.Mirror, error) {
			return []create.Mirror{{Prefix: "quay.io/", Location: "127.0.0.1:1/"}}, nil
		}})
	h.run(t)
	if err := h.p.Start(pull.Request{Release: release}); err != nil {
		t.Fatal(err)
	}
	s := h.wait(t, "the second failure", func(s *pull.Status) bool { return s.State == pull.StateRetrying && s.Attempts >= 2 })
	if !strings.Contains(s.Error, "127.0.0.1:1") || s.NextTry.IsZero() || !strings.Contains(s.Line(), "failed") {
		t.Errorf("the failure does not say where and when next: %+v / %q", s, s.Line())
	}
	if len(h.delivered) != 0 {
		t.Error("something was delivered")
	}
}

// An image the registry lacks fails the pull for good, naming it; the
// cluster's Ensure leaves it so, a person's Start runs it again.
func TestPuller_AMissingImageFailsOnceEnsureLeavesItStartRetries(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 1})
	h := newHarness(t, reg, pull.Options{Backoff: time.Hour})
	h.run(t)
	req := pull.Request{Release: release, Extras: []string{"quay.io/my/absent:v1"}}
	if err := h.p.Ensure(req); err != nil {
		t.Fatal(err)
	}
	s := h.wait(t, "the failure", func(s *pull.Status) bool { return s.State == pull.StateFailed })
	if !strings.Contains(s.Error, "my/absent") || s.Attempts != 0 {
		t.Errorf("failure %+v", s)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "request.json")); !os.IsNotExist(err) {
		t.Errorf("a failed request stays to be resumed: %v", err)
	}
	if err := h.p.Ensure(req); err != nil || h.p.Status().State != pull.StateFailed {
		t.Errorf("Ensure ran a failed request again: %v, %+v", err, h.p.Status())
	}
	if err := h.p.Start(req); err != nil || h.p.Status().State == pull.StateFailed {
		t.Errorf("Start did not run it again: %v, %+v", err, h.p.Status())
	}
	h.wait(t, "the second failure", func(s *pull.Status) bool { return s.State == pull.StateFailed })
}

// A request on disk (ferry restarted) is resumed: pulled, delivered, and
// once the agent holds it, its request and bundle go.
func TestPuller_ARequestOnDiskIsResumedAndEndsOnceHeld(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 2})
	dir := t.TempDir()
	b, _ := json.Marshal(pull.Request{Release: release})
	if err := os.WriteFile(filepath.Join(dir, "request.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, reg, pull.Options{Dir: dir}) // as a restarted agent
	if s := h.p.Status(); s == nil || s.Release != release {
		t.Fatalf("the request on disk is not taken: %+v", s)
	}
	h.run(t)
	h.wait(t, "the pull's end", func(s *pull.Status) bool { return s.State == pull.StateDone })
	h.mu.Lock()
	n := len(h.delivered)
	var res *create.Result
	if n > 0 {
		res = h.delivered[0]
	}
	h.mu.Unlock()
	if n != 1 || res.Metadata.Release != release || res.Digest == "" {
		t.Fatalf("delivered %d: %+v", n, res)
	}
	for _, p := range []string{"request.json", "out"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s stays once the agent holds the bundle: %v", p, err)
		}
	}
}

// Outside its window a pull waits, saying when it opens.
func TestPuller_OutsideItsWindowItWaits(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 1})
	noon := time.Date(2026, 11, 27, 12, 0, 0, 0, time.Local)
	h := newHarness(t, reg, pull.Options{Now: func() time.Time { return noon }})
	h.run(t)
	if err := h.p.Start(pull.Request{Release: release, Window: "22:00-06:00"}); err != nil {
		t.Fatal(err)
	}
	s := h.wait(t, "waiting for the window", func(s *pull.Status) bool { return s.State == pull.StateWaiting })
	if !s.NextTry.Equal(time.Date(2026, 11, 27, 22, 0, 0, 0, time.Local)) || s.Window != "22:00-06:00" || !strings.Contains(s.Line(), "opens 22:00") {
		t.Errorf("waiting: %+v / %q", s, s.Line())
	}
	if reqs := reg.BlobFetches(); reqs != 0 {
		t.Errorf("%d blobs fetched outside the window", reqs)
	}
}
