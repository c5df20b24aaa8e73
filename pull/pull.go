// Package pull is ferry's registry mode: it copies a release and extra
// images from the site's registry, through the node's own registries
// configuration and pull secret, into a bundle on the node's disk:
// resumably, within a rate and a time window, reporting its progress.
// The bundle is then handed to the agent, which verifies, shares, loads
// and pins it as it does one from a stick. While it pulls, the node
// serves what arrived to the other nodes (serve.go), which make the same
// bundle from it as it arrives (Request.From), so each byte crosses the
// site's link once.
package pull

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/atomicfile"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// What a pull is asked and how it stands live in pullspec, a leaf the
// agent imports without linking this package's registry client.
type (
	Request = pullspec.Request
	Status  = pullspec.Status
	Window  = pullspec.Window
)

// ParseWindow reads "HH:MM-HH:MM"; "" is always open.
func ParseWindow(s string) (Window, error) { return pullspec.ParseWindow(s) }

// States of a pull (Status.State).
const (
	StateWaiting    = pullspec.StateWaiting
	StateFetching   = pullspec.StateFetching
	StateRetrying   = pullspec.StateRetrying
	StateHanding    = pullspec.StateHanding
	StateDone       = pullspec.StateDone
	StateFailed     = pullspec.StateFailed
	StateNotStarted = pullspec.StateNotStarted
)

func sameRequest(r, o Request) bool {
	return r.Release == o.Release && slices.Equal(r.Extras, o.Extras) && r.From == o.From && maps.Equal(r.Pins, o.Pins)
}

// Check refuses a request that names no release by digest, or an image
// that is no image reference.
func Check(r Request) error {
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
	if _, _, err := net.SplitHostPort(r.From); r.From != "" && err != nil {
		return fmt.Errorf("the node to follow, %q, is no host:port: %v", r.From, err)
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
	Delivered func(digest.Digest) (bool, error)
	Log       *slog.Logger
	Now       func() time.Time
	// Backoff is the first wait after a failed run; it doubles up to
	// 16 times as long. Default 30 s; a follower's is a sixth of it.
	Backoff time.Duration
	// Peers is how a follower reaches the node it follows (Request.From);
	// nil: this node follows none.
	Peers *PeerAccess
	// ShareWait bounds how long a follower's request waits for what
	// this node's pull has not fetched yet (Handler); 0: 10 s, within
	// the peers' response header timeout (15 s).
	ShareWait time.Duration
	// ShareStall cuts a response to a follower that sends nothing for
	// this long (a follower that stopped reading); 0: 30 s.
	ShareStall time.Duration
	// FollowStall cuts a response from the followed node that sends
	// nothing for this long (that node, or the link to it, stalled): the
	// follower asks again from where it stopped; 0: 30 s.
	FollowStall time.Duration
}

// PeerAccess is the peers' transport: it adds the peers' token, or
// presents this node's certificate (TLS, node identities).
type PeerAccess struct {
	Transport http.RoundTripper
	TLS       bool
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
	// shared is this node's pull as the nodes following it see it.
	shared *shared
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
	if o.ShareWait <= 0 {
		o.ShareWait = 10 * time.Second
	}
	if o.ShareStall <= 0 {
		o.ShareStall = 30 * time.Second
	}
	if o.FollowStall <= 0 {
		o.FollowStall = 30 * time.Second
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	p := &Puller{o: o, log: o.Log.With("part", "pull"), wake: make(chan struct{}, 1), shared: newShared(o.ShareWait, o.ShareStall)}
	p.shared.resolved = func(r *create.Resolution) { p.set(func(s *Status) { s.Extras = maps.Clone(r.Extras) }) }
	if b, err := os.ReadFile(p.requestPath()); err == nil {
		var r Request
		if json.Unmarshal(b, &r) == nil && Check(r) == nil {
			p.req = &r
			p.st = &Status{State: StateNotStarted, Release: r.Release, Bundle: r.Bundle, From: r.FromNode}
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
	if err := Check(req); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.req != nil && sameRequest(*p.req, req) {
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
	p.st = &Status{State: StateNotStarted, Release: req.Release, Bundle: req.Bundle, From: req.FromNode}
	p.shared.served.Store(0)
	select {
	case p.wake <- struct{}{}:
	default:
	}
	rate, w := p.limits(req)
	p.log.Info("pull requested", "release", req.Release, "extras", len(req.Extras), "bundle", req.Bundle, "window", w.String(), "rateLimit", rate, "from", req.From)
	return nil
}

// Unfollow ends a follower's pull of release while it fetches (the
// agent holds the release: it came through the peers first). One that
// made its bundle is left to hand it over; a node's own pull goes on.
func (p *Puller) Unfollow(release string) {
	p.mu.Lock()
	req, st, abort := p.req, p.st, p.abort
	p.mu.Unlock()
	if req == nil || req.From == "" || req.Release != release || st == nil || st.State == StateHanding || st.State == StateDone {
		return
	}
	p.log.Info("the agent holds the release: following the other node's pull ends", "release", release, "from", req.FromNode)
	if abort != nil {
		abort()
	}
	p.set(func(s *Status) { s.State = StateDone })
	p.forget(*req)
}

// Status is the pull's progress; nil when there is none.
func (p *Puller) Status() *Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st == nil {
		return nil
	}
	s := *p.st
	s.Shared, s.Waiting = p.shared.served.Load(), p.shared.waiters()
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
		if permanent(err) && (req.From == "" || errors.Is(err, errRefused)) {
			p.log.Error("pull failed", "release", req.Release, "err", err)
			p.set(func(s *Status) { s.State, s.Error = StateFailed, err.Error() })
			p.forget(req)
			return
		}
		attempts++
		// A follower's failures are mostly the followed node not there
		// yet, or restarting: it asks again sooner, and never gives up.
		first := p.o.Backoff
		if req.From != "" {
			first /= 6
		}
		wait := min(first<<min(attempts-1, 4), 16*first)
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
		errors.Is(err, create.ErrTooLarge) || errors.Is(err, errRefused)
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

// createBundle runs bundle create into the pull's directory: from the
// site's registry, or, following another node's pull, from that node.
func (p *Puller) createBundle(ctx context.Context, req Request) (*create.Result, error) {
	o := create.Options{
		Release: req.Release, ExtraImages: req.Extras, Pins: req.Pins, Arch: p.o.Arch, Created: req.Created,
		OutputDir: p.outDir(), WorkDir: p.workDir(), BeforeCopy: p.o.CheckRoom, Log: p.log,
		Progress: func(pr create.Progress) {
			p.set(func(s *Status) {
				s.Images, s.Total, s.Bytes, s.ToFetch = pr.Images, pr.ImagesTotal, pr.Bytes, pr.BytesTotal
				s.Rate, s.ETA = pr.Rate(), pr.ETA()
			})
		},
	}
	var err error
	if req.From != "" {
		err = p.following(ctx, req, &o)
	} else {
		err = p.fromRegistry(req, &o)
	}
	if err != nil {
		return nil, err
	}
	p.set(func(s *Status) { s.State, s.Error, s.NextTry = StateFetching, "", time.Time{} })
	p.log.Info("pulling", "release", req.Release, "extras", len(req.Extras), "mirrors", len(o.Mirrors), "from", cmp.Or(req.FromNode, "the registry"))
	if o.Share == nil {
		return create.Run(ctx, o)
	}
	// Served while it runs; its tree goes once the requests it is
	// answering are answered (a follower that waited for the last blob
	// gets it), and then is served no more. The bundle is delivered
	// meanwhile: no follower holds it.
	p.shared.begin()
	o.KeepWork = true
	res, err := create.Run(ctx, o)
	remove := ""
	if err == nil {
		remove = res.WorkDir
	}
	p.shared.end(remove)
	return res, err
}

// fromRegistry sets o to fetch through the node's registries
// configuration, certs.d and pull secret, at the request's rate, and
// to share what arrives.
func (p *Puller) fromRegistry(req Request, o *create.Options) error {
	if p.o.Mirrors != nil {
		var err error
		if o.Mirrors, err = p.o.Mirrors(); err != nil {
			return fmt.Errorf("the node's registries configuration: %w", err)
		}
	}
	if p.o.PullSecret != "" {
		if _, err := os.Stat(p.o.PullSecret); err == nil {
			k, err := create.LoadPullSecret(p.o.PullSecret)
			if err != nil {
				return err
			}
			o.Keychain = k
		}
	}
	if p.o.Transport != nil {
		var err error
		if o.Transport, err = p.o.Transport(); err != nil {
			return err
		}
	}
	o.RateLimit, _ = p.limits(req)
	o.SignatureStore, o.Share = p.o.SignatureStore, p.shared
	return nil
}

// following sets o to fetch everything from the node req follows, over
// the peers' transport: its images, and the release signatures it got
// (asked first, so that a follower never makes a bundle without them).
func (p *Puller) following(ctx context.Context, req Request, o *create.Options) error {
	if p.o.Peers == nil {
		return errors.New("this node reaches no peer: it cannot follow another node's pull")
	}
	scheme := "http"
	if p.o.Peers.TLS {
		scheme = "https"
	}
	ref, err := name.NewDigest(req.Release)
	if err != nil {
		return fmt.Errorf("%w: %v", create.ErrBadReference, err)
	}
	rt := idleCut{base: p.o.Peers.Transport, stall: p.o.FollowStall}
	hc := &http.Client{Transport: rt, Timeout: time.Minute}
	sigs, err := create.FetchSignatures(ctx, hc, scheme+"://"+req.From+SignaturePath, ref.DigestStr())
	if err != nil {
		return fmt.Errorf("the release signatures from node %s: %w", req.FromNode, err)
	}
	o.Source, o.Transport, o.Insecure, o.ReleaseSignatures = req.From, rt, !p.o.Peers.TLS, sigs
	return nil
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
	if json.Unmarshal(b, &m) != nil || !sameRequest(m.Request, req) {
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
	p.set(func(s *Status) { s.State, s.Digest, s.Error = StateHanding, res.Digest, "" })
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
		held, err := p.o.Delivered(res.Digest)
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
	if p.req == nil || !sameRequest(*p.req, req) {
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
