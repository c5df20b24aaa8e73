// Package pull is ferry's registry mode: it copies a release and extra
// images from the site's registry, through the node's own registries
// configuration and pull secret, into a bundle on the node's disk:
// resumably, within a rate and a time window, reporting its progress.
// The bundle is then handed to the agent, which verifies, shares, loads
// and pins it as it does one from a stick; the other nodes fetch it from
// this one through the peers, so each byte crosses the site's link once.
package pull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/atomicfile"
)

// Request is what to pull: a release by digest and extra images (by tag
// or digest).
type Request struct {
	Release string   `json:"release"`
	Extras  []string `json:"extras,omitempty"`
	// Bundle is the UpgradeBundle that asks for it ("" for ferry load).
	Bundle string `json:"bundle,omitempty"`
	// RateLimit and Window, when set, replace the node's (Options).
	RateLimit string `json:"rateLimit,omitempty"`
	Window    string `json:"window,omitempty"`
}

// Check refuses a request that names no release by digest, or an image
// that is no image reference.
func (r Request) Check() error {
	ref, err := name.ParseReference(r.Release)
	if err != nil {
		return fmt.Errorf("release %q is not an image reference: %v", r.Release, err)
	}
	if _, ok := ref.(name.Digest); !ok {
		return fmt.Errorf("release %q names no digest: give the release by digest (NAME@sha256:…, as 'oc adm release info' prints it): a tag can move between the request and the pull", r.Release)
	}
	for _, e := range r.Extras {
		if _, err := name.ParseReference(e); err != nil {
			return fmt.Errorf("extra image %q is not an image reference: %v", e, err)
		}
	}
	if r.RateLimit != "" {
		if n, err := bundle.ParseSize(r.RateLimit); err != nil || n <= 0 {
			return fmt.Errorf("rate limit %q is not a size per second (e.g. 2MiB)", r.RateLimit)
		}
	}
	_, err = ParseWindow(r.Window)
	return err
}

// limits are the rate and window req runs under: its own, else the
// node's.
func (p *Puller) limits(req Request) (int64, Window) {
	rate, w := p.o.RateLimit, p.o.Window
	if req.RateLimit != "" {
		rate, _ = bundle.ParseSize(req.RateLimit)
	}
	if req.Window != "" {
		w, _ = ParseWindow(req.Window)
	}
	return rate, w
}

func (r Request) same(o Request) bool {
	return r.Release == o.Release && slices.Equal(r.Extras, o.Extras)
}

// States of a pull (Status.State).
const (
	StateWaiting    = "waiting"  // for the time window
	StateFetching   = "fetching" // from the registry
	StateRetrying   = "retrying" // after a failure, until NextTry
	StateHanding    = "handing"  // the bundle is made; the agent takes it
	StateDone       = "done"     // the agent holds the bundle
	StateFailed     = "failed"   // cannot succeed as asked (Error says why)
	StateNotStarted = "not-started"
)

// Status is a pull's progress, for ferry status and the unit's line.
type Status struct {
	State    string        `json:"state"`
	Release  string        `json:"release"`
	Bundle   string        `json:"bundle,omitempty"` // the UpgradeBundle that asks for it
	Images   int           `json:"images,omitempty"`
	Total    int           `json:"imagesTotal,omitempty"`
	Bytes    int64         `json:"bytes"`      // over the link so far, this run
	ToFetch  int64         `json:"bytesTotal"` // what the run has to fetch
	Rate     float64       `json:"rate"`       // bytes per second
	ETA      time.Duration `json:"eta,omitempty"`
	Window   string        `json:"window,omitempty"`
	Error    string        `json:"error,omitempty"`
	Attempts int           `json:"attempts,omitempty"` // failed runs in a row
	NextTry  time.Time     `json:"nextTry,omitzero"`
	Digest   string        `json:"digest,omitempty"` // the bundle made
}

// Line is the status in one line.
func (s Status) Line() string {
	rel := shortRef(s.Release)
	switch s.State {
	case StateWaiting:
		return fmt.Sprintf("pulling %s from the registry: waiting for the window %s (opens %s)", rel, s.Window, s.NextTry.Local().Format("15:04"))
	case StateFetching:
		if s.ToFetch == 0 {
			return fmt.Sprintf("pulling %s from the registry: resolving %d/%d images", rel, s.Images, s.Total)
		}
		eta := ""
		if s.ETA > 0 {
			eta = ", about " + s.ETA.Round(time.Second).String() + " left"
		}
		return fmt.Sprintf("pulling %s from the registry: %s of %s over the link at %s/s%s", rel,
			bundle.HumanSize(s.Bytes), bundle.HumanSize(s.ToFetch), bundle.HumanSize(int64(s.Rate)), eta)
	case StateRetrying:
		return fmt.Sprintf("pulling %s from the registry: failed %d times, next try %s: %s", rel, s.Attempts, s.NextTry.Local().Format("15:04:05"), s.Error)
	case StateHanding:
		return fmt.Sprintf("pulled %s from the registry: verifying and extracting it", rel)
	case StateDone:
		return fmt.Sprintf("pulled %s from the registry", rel)
	case StateFailed:
		return fmt.Sprintf("pulling %s from the registry failed: %s", rel, s.Error)
	}
	return "pull " + s.State
}

// Coarse is Line in steps: whole percents and minutes. It goes into
// the UpgradeBundle, which every node watches: written when it changes,
// it changes about once a minute, not with every byte.
func (s Status) Coarse() string {
	if s.State != StateFetching || s.ToFetch == 0 {
		if s.State == StateRetrying {
			return fmt.Sprintf("pulling %s from the registry: failed %d times: %s", shortRef(s.Release), s.Attempts, s.Error)
		}
		return s.Line()
	}
	eta := ""
	if s.ETA > 0 {
		eta = ", about " + max(s.ETA.Round(time.Minute), time.Minute).String() + " left"
	}
	return fmt.Sprintf("pulling %s from the registry: %d%% of %s over the link%s", shortRef(s.Release),
		s.Bytes*100/s.ToFetch, bundle.HumanSize(s.ToFetch), eta)
}

func shortRef(r string) string {
	if i := strings.LastIndex(r, "@sha256:"); i >= 0 && len(r) > i+20 {
		return r[:i+20] + "…"
	}
	return r
}

// Options are what a Puller works with; Deliver and Delivered connect it
// to the agent.
type Options struct {
	Dir  string // its own directory: /var/lib/ferry/pull
	Arch string // uname -m
	// Mirrors are the node's registries configuration as bundle create
	// takes it; called for each run, so a changed configuration counts.
	Mirrors func() ([]create.Mirror, error)
	// Transport is made for each run, so that CAs added to the node's
	// certs.d since count.
	Transport  func() (http.RoundTripper, error)
	PullSecret string // a docker config.json; "" or missing: anonymous
	RateLimit  int64  // bytes per second over the link; 0: none
	Window     Window
	// SignatureStore is where the release's signature files are asked
	// for ("" none: the sigstore signatures in the registry still come).
	SignatureStore string
	// CheckRoom, when set, is asked once the images are resolved and
	// before any blob is fetched (create.Options.BeforeCopy): a node
	// without room to extract and load the release is told so before the
	// link carries a byte of it, not hours later.
	CheckRoom func(meta *bundle.Metadata, fetch, total int64) error
	// Deliver hands a bundle made to the agent, as approved by the
	// request (it names the release by digest).
	Deliver func(ctx context.Context, res *create.Result) error
	// Delivered says whether the agent holds the bundle (verified and
	// extracted): then its tar goes; an error is the agent's refusal.
	Delivered func(digest string) (bool, error)
	Log       *slog.Logger
	Now       func() time.Time
	// Backoff is the first wait after a failed run; it doubles up to
	// 16 times as long. Default 30 s.
	Backoff time.Duration
}

// Puller runs one pull at a time and resumes it after a restart.
type Puller struct {
	o     Options
	log   *slog.Logger
	mu    sync.Mutex
	st    *Status
	req   *Request
	wake  chan struct{}
	abort context.CancelFunc // the run in flight, for a new request
}

// New makes a Puller; Run does the work.
func New(o Options) (*Puller, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Backoff <= 0 {
		o.Backoff = 30 * time.Second
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	p := &Puller{o: o, log: o.Log.With("part", "pull"), wake: make(chan struct{}, 1)}
	if b, err := os.ReadFile(p.requestPath()); err == nil {
		var r Request
		if json.Unmarshal(b, &r) == nil && r.Check() == nil {
			p.req = &r
			p.st = &Status{State: StateNotStarted, Release: r.Release, Bundle: r.Bundle}
		}
	}
	return p, nil
}

func (p *Puller) requestPath() string { return filepath.Join(p.o.Dir, "request.json") }
func (p *Puller) outDir() string      { return filepath.Join(p.o.Dir, "out") }
func (p *Puller) workDir() string     { return filepath.Join(p.o.Dir, "work") }

// Start asks for req: kept on disk, so a restart resumes it. The same
// request under way changes nothing; one that failed or was done runs
// again; another replaces the one under way (what it fetched and the new
// one shares is kept).
func (p *Puller) Start(req Request) error { return p.start(req, true) }

// Ensure is Start, except that a request that failed or was done is
// left so: the cluster's sources are read again and again, and a release
// the registry lacks is not asked for at every read.
func (p *Puller) Ensure(req Request) error { return p.start(req, false) }

func (p *Puller) start(req Request, again bool) error {
	if err := req.Check(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.req != nil && p.req.same(req) {
		return nil
	}
	if !again && p.req == nil && p.st != nil && p.st.Release == req.Release && (p.st.State == StateFailed || p.st.State == StateDone) {
		return nil
	}
	b, _ := json.Marshal(req)
	if err := atomicfile.WriteFile(p.requestPath(), b, 0o600); err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	if p.req != nil && p.abort != nil {
		p.log.Info("a new pull replaces the one under way", "was", p.req.Release, "now", req.Release)
		p.abort()
	}
	p.req = &req
	p.st = &Status{State: StateNotStarted, Release: req.Release, Bundle: req.Bundle}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	rate, w := p.limits(req)
	p.log.Info("pull requested", "release", req.Release, "extras", len(req.Extras), "bundle", req.Bundle, "window", w.String(), "rateLimit", rate)
	return nil
}

// Status is the pull's progress; nil when there is none.
func (p *Puller) Status() *Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st == nil {
		return nil
	}
	s := *p.st
	if p.req != nil {
		_, w := p.limits(*p.req)
		s.Window = w.String()
	}
	return &s
}

func (p *Puller) set(f func(*Status)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st != nil {
		f(p.st)
	}
}

// Run pulls what is asked until ctx ends.
func (p *Puller) Run(ctx context.Context) error {
	for {
		p.mu.Lock()
		req := p.req
		var rctx context.Context
		var cancel context.CancelFunc
		if req != nil {
			rctx, cancel = context.WithCancel(ctx)
			p.abort = cancel
		}
		p.mu.Unlock()
		if req != nil {
			p.run(rctx, *req)
			cancel()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		}
	}
}

// run pulls req until the agent holds it, it fails for good, or ctx ends.
func (p *Puller) run(ctx context.Context, req Request) {
	attempts := 0
	for ctx.Err() == nil {
		res, err := p.fetch(ctx, req)
		if err == nil {
			err = p.deliver(ctx, req, res)
			if err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if permanent(err) {
			p.log.Error("pull failed", "release", req.Release, "err", err)
			p.set(func(s *Status) { s.State, s.Error = StateFailed, err.Error() })
			p.forget(req)
			return
		}
		attempts++
		wait := min(p.o.Backoff<<min(attempts-1, 4), 16*p.o.Backoff)
		next := p.o.Now().Add(wait)
		// Logged every time: a registry that stays unreachable is seen in
		// the journal and the status, never retried in silence.
		p.log.Warn("pull failed; trying again", "release", req.Release, "attempt", attempts, "next", next.Format(time.TimeOnly), "err", err)
		p.set(func(s *Status) {
			s.State, s.Error, s.Attempts, s.NextTry = StateRetrying, err.Error(), attempts, next
		})
		if sleep(ctx, wait) != nil {
			return
		}
	}
}

// permanent reports whether another try cannot help: the request names
// what the registry does not have, or what is not a release.
func permanent(err error) bool {
	return errors.Is(err, create.ErrNotFound) || errors.Is(err, create.ErrBadReference) || errors.Is(err, create.ErrRelease) ||
		errors.Is(err, errRefused)
}

var errRefused = errors.New("refused by the agent")

// fetch makes the bundle, within the window: a run the window's end
// stops resumes at its next opening from what the work tree holds.
func (p *Puller) fetch(ctx context.Context, req Request) (*create.Result, error) {
	if res := p.made(req); res != nil {
		return res, nil // made before a restart, not yet taken
	}
	_, window := p.limits(req)
	for {
		open, change := window.State(p.o.Now())
		if !open {
			p.log.Info("waiting for the pull window", "window", window.String(), "opens", change.Format(time.DateTime))
			p.set(func(s *Status) { s.State, s.NextTry = StateWaiting, change })
			if err := sleep(ctx, change.Sub(p.o.Now())); err != nil {
				return nil, err
			}
			continue
		}
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if !change.IsZero() {
			wctx, cancel = context.WithDeadline(ctx, change)
		}
		res, err := p.createBundle(wctx, req)
		closed := ctx.Err() == nil && wctx.Err() != nil
		cancel()
		if closed {
			p.log.Info("the pull window closed: the pull goes on when it opens again", "window", window.String())
			continue
		}
		return res, err
	}
}

// createBundle runs bundle create into the pull's directory.
func (p *Puller) createBundle(ctx context.Context, req Request) (*create.Result, error) {
	var mirrors []create.Mirror
	if p.o.Mirrors != nil {
		var err error
		if mirrors, err = p.o.Mirrors(); err != nil {
			return nil, fmt.Errorf("the node's registries configuration: %w", err)
		}
	}
	var keychain authn.Keychain
	if p.o.PullSecret != "" {
		if _, err := os.Stat(p.o.PullSecret); err == nil {
			k, err := create.LoadPullSecret(p.o.PullSecret)
			if err != nil {
				return nil, err
			}
			keychain = k
		}
	}
	var tr http.RoundTripper
	if p.o.Transport != nil {
		var err error
		if tr, err = p.o.Transport(); err != nil {
			return nil, err
		}
	}
	rate, _ := p.limits(req)
	p.set(func(s *Status) { s.State, s.Error, s.NextTry = StateFetching, "", time.Time{} })
	p.log.Info("pulling from the registry", "release", req.Release, "extras", len(req.Extras), "mirrors", len(mirrors))
	return create.Run(ctx, create.Options{
		Release: req.Release, ExtraImages: req.Extras, Arch: p.o.Arch,
		Mirrors: mirrors, Keychain: keychain, Transport: tr,
		OutputDir: p.outDir(), WorkDir: p.workDir(),
		RateLimit: rate, SignatureStore: p.o.SignatureStore, BeforeCopy: p.o.CheckRoom,
		Log: p.log,
		Progress: func(pr create.Progress) {
			p.set(func(s *Status) {
				s.Images, s.Total, s.Bytes, s.ToFetch = pr.Images, pr.ImagesTotal, pr.Bytes, pr.BytesTotal
				s.Rate, s.ETA = pr.Rate(), pr.ETA()
			})
		},
	})
}

// made is the bundle an earlier run made for req and the agent has not
// taken yet, or nil.
func (p *Puller) made(req Request) *create.Result {
	b, err := os.ReadFile(filepath.Join(p.outDir(), "made.json"))
	if err != nil {
		return nil
	}
	var m struct {
		Request Request
		Result  create.Result
	}
	if json.Unmarshal(b, &m) != nil || !m.Request.same(req) {
		return nil
	}
	if _, err := os.Stat(m.Result.TarPath); err != nil {
		return nil
	}
	return &m.Result
}

// deliver hands the bundle to the agent and waits until it holds it;
// then the pull's files go.
func (p *Puller) deliver(ctx context.Context, req Request, res *create.Result) error {
	b, _ := json.Marshal(struct {
		Request Request
		Result  *create.Result
	}{req, res})
	if err := atomicfile.WriteFile(filepath.Join(p.outDir(), "made.json"), b, 0o600); err != nil {
		return err
	}
	p.set(func(s *Status) { s.State, s.Digest, s.Error = StateHanding, string(res.Digest), "" })
	p.log.Info("pulled: handing the bundle to the agent", "release", req.Release, "digest", res.Digest,
		"bytes", res.BytesFetched, "blobsFetched", res.BlobsFetched, "blobsReused", res.BlobsReused)
	for {
		err := p.o.Deliver(ctx, res)
		if err == nil {
			break
		}
		// Busy with another job: ask again shortly.
		p.log.Debug("the agent cannot take the pulled bundle yet", "err", err)
		if sleep(ctx, 5*time.Second) != nil {
			return ctx.Err()
		}
	}
	for {
		held, err := p.o.Delivered(string(res.Digest))
		if err != nil {
			p.forget(req)
			return fmt.Errorf("%w: %v", errRefused, err)
		}
		if held {
			break
		}
		if sleep(ctx, time.Second) != nil {
			return ctx.Err()
		}
	}
	p.set(func(s *Status) { s.State = StateDone })
	p.log.Info("the agent holds the pulled bundle: its tar goes", "digest", res.Digest)
	p.forget(req)
	return nil
}

// forget ends req: its request file and the bundle made go; the work
// tree (gone after a successful run) stays for a retry of a failed one.
func (p *Puller) forget(req Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.req == nil || !p.req.same(req) {
		return
	}
	os.Remove(p.requestPath())
	os.RemoveAll(p.outDir())
	p.req = nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
