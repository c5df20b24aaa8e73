// Package create makes bundles on the engineer's workstation (ferry bundle
// create) and on a node in registry mode (pull): it resolves a release and
// extra images through mirrors, a pull secret and a certs.d directory,
// copies them and their sigstore attachments into a registry tree with
// resumable, rate-limited blob fetches, fetches the release signatures,
// and writes the tar in bundle's format, its .sha256 and its .minisig:
//
//	res, err := create.Run(ctx, create.Options{Release: ref, OutputDir: dir})
package create

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"aead.dev/minisign"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	godigest "github.com/opencontainers/go-digest"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/atomicfile"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/diskspace"
)

// Platform choices for manifest lists (Options.Platforms).
const (
	// PlatformsArch (the default) keeps a manifest list's own bytes, so its
	// digest still resolves, but copies only its linux/<arch> images: a node
	// pulling the list gets its own platform from the bundle.
	PlatformsArch = "arch"
	// PlatformsAll copies every image a manifest list names.
	PlatformsAll = "all"
)

// Options are the inputs of Run (ferry bundle create's flags).
type Options struct {
	Release string // release image reference (tag or digest)
	// Releases, when more than one, replace Release: the bundle holds
	// each and the path through them in version order (metadata's path),
	// one hop the version operator accepts after another; their versions
	// are their own (Version must be empty).
	Releases    []string
	Version     string   // fills release-metadata's version; must agree with it
	Arch        string   // uname -m (or GOARCH) name; overrides or fills the image config's
	ExtraImages []string // custom images; tags are resolved and kept
	Platforms   string   // PlatformsArch (default) or PlatformsAll
	Signatures  string   // SignaturesAll (default) or SignaturesRelease
	Mirrors     []Mirror

	Keychain  authn.Keychain    // nil: anonymous
	Transport http.RoundTripper // nil: Go's default
	Insecure  bool              // allow plain HTTP (with --tls-verify=false)

	OutputDir string // where the tar, .sha256 and .minisig go
	// WorkDir holds the registry tree while it is built; default
	// <OutputDir>/.ferry-work-<version>-<arch>. A run that stops keeps it,
	// and the next run reuses every blob in it; a successful run removes it
	// unless KeepWork.
	WorkDir  string
	KeepWork bool

	SignKey *minisign.PrivateKey // nil: no signature
	// ReleaseSignatures are the release image's signature files; when
	// none are given, SignatureStore (a URL, "" for none) is asked.
	ReleaseSignatures [][]byte
	SignatureStore    string
	SignatureClient   *http.Client // nil: a client with a 20 s timeout
	Jobs              int          // images copied at once; default 4
	// RateLimit bounds the bytes per second fetched, all blobs together;
	// 0: no bound.
	RateLimit int64
	// BeforeCopy, when set, is asked once every image is resolved and
	// before any blob is fetched, with the bundle's metadata (SizeBytes
	// from its blobs), the bytes to fetch and the bytes of the whole: its
	// error stops the run (a node without room for the load).
	BeforeCopy func(meta *bundle.Metadata, fetch, total int64) error
	Created    time.Time // metadata.created; default now
	// Source, when set, is the one registry (host:port) every image is
	// fetched from, under its original name (a node following another's
	// pull); Mirrors are then not used.
	Source string
	// Pins are the digests extra images given by tag must resolve to
	// (by the extra as ExtraImages names it): a node following another's
	// pull takes the tag as that node resolved it and published it
	// through the cluster's API, and refuses a source that serves the tag
	// otherwise (ErrPinMismatch).
	Pins map[string]digest.Digest
	// Share, when set, is told what the run resolved and each blob as it
	// arrives, for other nodes to follow (pull serves its work tree).
	Share Sharer
	Log   *slog.Logger
	// Progress, when set, receives snapshots a few times a second and once
	// with Phase "done".
	Progress func(Progress)
}

// Result is what Run made.
type Result struct {
	Metadata      *bundle.Metadata
	TarPath       string
	SHA256Path    string
	SignaturePath string        // "" without a key
	Digest        digest.Digest // sha256:<hex> of the tar
	TarSize       int64
	BlobsFetched  int
	BlobsReused   int // found in the work tree from an earlier run
	BytesFetched  int64
	WorkDir       string
}

// Run copies a release's images and extra images into a registry tree
// and writes the bundle: <OutputDir>/upgrade-<version>-<arch>.tar, its
// .sha256 and, with a key, its .tar.minisig. The tar is written as
// .tar.partial and renamed only when complete; the .sha256 and signature
// follow, each written atomically.
func Run(ctx context.Context, o Options) (*Result, error) {
	c, err := newCreator(ctx, o)
	if err != nil {
		return nil, err
	}
	defer c.stopProgress()
	return c.run(ctx)
}

type creator struct {
	o      Options
	log    *slog.Logger
	puller *remote.Puller
	blobs  *blobFetcher // resumable blob fetches
	limit  *rateLimiter // nil: no rate limit
	nameOp []name.Option
	// insecureHosts are the mirrors the node's configuration marks
	// insecure: their certificates are not checked.
	insecureHosts sync.Map
	// manifestBytes are the manifests' bytes the run holds in memory
	// (maxHeldManifests).
	manifestBytes atomic.Int64
	arch          string // uname -m
	store         *treeStore
	paths         map[string]string // original name → tree path

	prog     progressCounter
	stopProg chan struct{}
	progDone chan struct{}
}

func newCreator(ctx context.Context, o Options) (*creator, error) {
	if o.Release == "" && len(o.Releases) == 0 {
		return nil, fmt.Errorf("%w: no release image given", ErrBadReference)
	}
	if o.OutputDir == "" {
		return nil, errors.New("no output directory given")
	}
	switch o.Platforms {
	case "":
		o.Platforms = PlatformsArch
	case PlatformsArch, PlatformsAll:
	default:
		return nil, fmt.Errorf("platforms %q: want %q or %q", o.Platforms, PlatformsArch, PlatformsAll)
	}
	switch o.Signatures {
	case "":
		o.Signatures = SignaturesAll
	case SignaturesAll, SignaturesRelease:
	default:
		return nil, fmt.Errorf("signatures %q: want %q or %q", o.Signatures, SignaturesAll, SignaturesRelease)
	}
	if o.Arch != "" {
		a := bundle.UnameArch(o.Arch)
		if a == "" {
			return nil, fmt.Errorf("arch %q: want one of %s", o.Arch, strings.Join(bundle.Arches, ", "))
		}
		o.Arch = a
	}
	if o.Jobs <= 0 {
		o.Jobs = 4
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Keychain == nil {
		o.Keychain = authn.NewMultiKeychain() // anonymous
	}
	if o.Transport == nil {
		o.Transport = http.DefaultTransport
	}
	if o.Created.IsZero() {
		o.Created = time.Now()
	}
	o.Created = o.Created.UTC().Truncate(time.Second)
	c := &creator{o: o, log: o.Log, arch: o.Arch}
	if o.Insecure {
		c.nameOp = append(c.nameOp, name.Insecure)
	}
	p, err := remote.NewPuller(
		remote.WithContext(ctx),
		remote.WithTransport(&insecureTransport{base: o.Transport, hosts: &c.insecureHosts}),
		remote.WithAuthFromKeychain(o.Keychain),
		remote.WithUserAgent("ferry-bundle-create"),
		remote.WithRetryBackoff(remote.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
	)
	if err != nil {
		return nil, err
	}
	c.puller = p
	c.blobs = &blobFetcher{keychain: o.Keychain, base: &insecureTransport{base: o.Transport, hosts: &c.insecureHosts}, ua: "ferry-bundle-create"}
	if o.RateLimit > 0 {
		c.limit = &rateLimiter{perSecond: o.RateLimit}
	}
	c.prog.start = time.Now()
	c.prog.phase.Store("resolve")
	if o.Progress != nil {
		c.stopProg, c.progDone = make(chan struct{}), make(chan struct{})
		go c.reportProgress()
	}
	return c, nil
}

func (c *creator) reportProgress() {
	defer close(c.progDone)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.o.Progress(c.prog.snapshot())
		case <-c.stopProg:
			return
		}
	}
}

func (c *creator) stopProgress() {
	if c.stopProg != nil {
		close(c.stopProg)
		<-c.progDone
		c.stopProg = nil
	}
}

// imageRef is an image under its original name, and where it is fetched.
type imageRef struct {
	name   string // original repository name, e.g. quay.io/org/repo
	tag    string
	digest string // sha256:…, "" until resolved
	fetch  name.Repository
	// routes are where the node's mirrors let it be fetched, in order;
	// fetch is the first until one of them served it (chosen).
	routes []name.Repository
	chosen bool
	pin    digest.Digest // what the tag must resolve to; "" any
}

// String is the reference metadata.json records: name[:tag]@sha256:….
func (r *imageRef) String() string {
	s := r.name
	if r.tag != "" {
		s += ":" + r.tag
	}
	if r.digest != "" {
		s += "@" + r.digest
	}
	return s
}

func (r *imageRef) host() string { return r.fetch.RegistryStr() }

// refIn is the image in repo, one of its routes: by digest when known.
func (r *imageRef) refIn(repo name.Repository) name.Reference {
	if r.digest != "" {
		return repo.Digest(r.digest)
	}
	return repo.Tag(r.tag)
}

func (c *creator) parseRef(s string) (*imageRef, error) {
	s = strings.TrimSpace(s)
	n, tag, dig := bundle.SplitRef(s)
	bad := func(err error) error { return fmt.Errorf("%w: %q: %v", ErrBadReference, s, err) }
	repo, err := name.NewRepository(n, name.StrictValidation)
	if err != nil {
		return nil, bad(err)
	}
	if tag != "" {
		if _, err := name.NewTag(n+":"+tag, name.StrictValidation); err != nil {
			return nil, bad(err)
		}
	}
	if dig != "" {
		if _, err := name.NewDigest(n+"@"+dig, name.StrictValidation); err != nil {
			return nil, bad(err)
		}
	}
	if tag == "" && dig == "" {
		tag = "latest"
	}
	orig := repo.Name()
	if rest, ok := strings.CutPrefix(orig, name.DefaultRegistry+"/"); ok {
		orig = "docker.io/" + rest
	}
	rs, err := routes(orig, dig != "", c.o.Mirrors)
	if c.o.Source != "" {
		rs, err = []route{{name: c.o.Source + "/" + orig}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadReference, s, err)
	}
	r := &imageRef{name: orig, tag: tag, digest: dig}
	for _, rt := range rs {
		op := c.nameOp
		if rt.insecure {
			op = append(slices.Clip(op), name.Insecure)
			c.insecureHosts.Store(strings.SplitN(rt.name, "/", 2)[0], true)
		}
		repo, err := name.NewRepository(rt.name, op...)
		if err != nil {
			return nil, fmt.Errorf("%w: %q through a mirror is %q: %v", ErrBadReference, s, rt.name, err)
		}
		r.routes = append(r.routes, repo)
	}
	r.fetch = r.routes[0]
	return r, nil
}

// fromRoutes runs try on r's routes in order until one serves the image,
// and keeps that one for the rest of it, as containers/image keeps the
// first mirror that has an image. Found nowhere, the error says what each
// place answered; it is ErrNotFound when one of them said so (a mirror
// that lacks the image is what to act on, though the origin beyond it was
// unreachable), else the last place's.
func (r *imageRef) fromRoutes(ctx context.Context, log *slog.Logger, try func(name.Repository) error) error {
	if r.chosen || len(r.routes) < 2 {
		return try(r.fetch)
	}
	var tried []string
	var last, notFound error
	for _, repo := range r.routes {
		err := try(repo)
		if err == nil {
			r.fetch, r.chosen = repo, true
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		log.Info("a mirror does not serve the image; trying the next place", "image", r.String(), "mirror", repo.String(), "err", err)
		tried = append(tried, err.Error())
		last = err
		if notFound == nil && errors.Is(err, ErrNotFound) {
			notFound = err
		}
	}
	return fmt.Errorf("%w; each place the registries configuration names, in order: %s", cmp.Or(notFound, last), strings.Join(tried, "; "))
}

func (c *creator) run(ctx context.Context) (*Result, error) {
	o := c.o
	// The releases: what they are, their versions and arch, their payloads.
	rels, err := c.parseReleases()
	if err != nil {
		return nil, err
	}
	// The extras are checked first: a bad one (or one the node's
	// configuration blocks) fails before anything is fetched.
	var extras []*imageRef
	for _, s := range o.ExtraImages {
		r, err := c.parseRef(s)
		if err != nil {
			return nil, fmt.Errorf("--extra-image: %w", err)
		}
		if r.tag != "" && r.digest == "" {
			r.pin = o.Pins[s]
		}
		extras = append(extras, r)
	}
	path, version, err := c.inspectPath(ctx, rels)
	if err != nil {
		return nil, err
	}
	if err := c.checkSignatureFiles(path); err != nil {
		return nil, err
	}
	rel := path[len(path)-1].ref

	// The bundle's release first, each image once: releases of a path
	// share most of their payload.
	refs := []*imageRef{rel}
	planned := map[string]bool{rel.String(): true}
	for _, p := range path[:len(path)-1] {
		planned[p.ref.String()] = true
		refs = append(refs, p.ref)
	}
	for _, p := range path {
		for _, s := range p.info.Payload {
			r, err := c.parseRef(s)
			if err != nil {
				return nil, fmt.Errorf("release %s names %w", p.ref, err)
			}
			if !planned[r.String()] {
				planned[r.String()] = true
				refs = append(refs, r)
			}
		}
	}
	refs = append(refs, extras...)
	var names []string
	for _, r := range refs {
		names = append(names, r.name)
	}
	c.paths = bundle.RepoPaths(names)

	workDir := o.WorkDir
	if workDir == "" {
		workDir = filepath.Join(o.OutputDir, ".ferry-work-"+version+"-"+c.arch)
	}
	if err := os.MkdirAll(o.OutputDir, 0o755); err != nil {
		return nil, fmt.Errorf("--output: %w", err)
	}
	if c.store, err = openTreeStore(ctx, workDir, o.Share); err != nil {
		return nil, fmt.Errorf("work directory %s: %w", workDir, err)
	}
	c.log.Info("bundle create", "release", rel.String(), "version", version, "arch", c.arch,
		"images", len(refs), "workDir", workDir, "platforms", o.Platforms, "hops", len(path))

	// Resolve every image to its manifests and blobs.
	plans := make([]*imagePlan, len(refs))
	c.prog.imagesTotal.Store(int64(len(refs)))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, r := range refs {
		g.Go(func() error {
			p, err := c.plan(gctx, r)
			plans[i] = p
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// One entry per distinct reference; the release is not in images.
	meta := &bundle.Metadata{Version: version, Arch: c.arch, Release: rel.String(), Created: o.Created}
	c.pathMetadata(ctx, meta, path)
	meta.FormatVersion = meta.OldestFormat()
	seen := map[string]bool{rel.String(): true}
	for _, p := range plans[1:] {
		if s := p.ref.String(); !seen[s] {
			seen[s] = true
			meta.Images = append(meta.Images, s)
		}
	}
	sigs, err := c.planSignatures(ctx, plans)
	if err != nil {
		return nil, err
	}
	for _, p := range sigs {
		meta.Signatures = append(meta.Signatures, p.ref.String())
	}
	c.prog.imagesTotal.Add(int64(len(sigs)))
	for _, p := range path {
		if !slices.ContainsFunc(meta.Signatures, func(s string) bool { return meta.SignatureOf(s) == p.ref.name+"@"+p.ref.digest }) {
			c.log.Warn("the release image carries no sigstore signature: OpenShift 4.21+ nodes refuse it unless their policy allows unsigned images", "release", p.ref.String())
		}
	}
	c.log.Info("sigstore signatures copied", "signatures", len(sigs))
	plans = append(plans, sigs...)
	if o.Share != nil {
		r := resolution(workDir, plans, meta.ReleaseSignatures)
		r.Extras = resolvedExtras(o.ExtraImages, extras)
		o.Share.Resolved(r)
	}
	missing, total, err := c.checkSpace(plans, workDir)
	if err != nil {
		return nil, err
	}
	if o.BeforeCopy != nil {
		// What the bundle will hold, sized from its blobs before any is
		// fetched: the node's room for it, its tar and its load.
		est := *meta
		est.SizeBytes = total
		if err := o.BeforeCopy(&est, missing, total); err != nil {
			return nil, err
		}
	}

	// Copy.
	c.prog.phase.Store("copy")
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(o.Jobs)
	for _, p := range plans {
		g.Go(func() error {
			if err := c.copyImage(gctx, p); err != nil {
				return err
			}
			c.prog.images.Add(1)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	removed, err := c.store.prune()
	if err != nil {
		return nil, err
	}
	if removed > 0 {
		c.log.Info("removed files of an earlier run that this bundle does not need", "files", removed)
	}

	// Each image's bytes: a node sizes its load with them before it
	// extracts the bundle. Without them it counts the whole bundle.
	if blobs, err := bundle.ImageBlobs(workDir, meta.AllImages(), bundle.GoArch(c.arch)); err != nil {
		c.log.Warn("the bundle goes without its per-image sizes", "err", err)
	} else {
		meta.ImageBytes = bundle.ImageSizes(blobs)
	}

	// Write.
	c.prog.phase.Store("write")
	res, err := c.writeBundle(meta, workDir)
	if err != nil {
		return nil, err
	}
	res.BlobsFetched, res.BlobsReused = int(c.store.fetched.Load()), int(c.store.reused.Load())
	res.BytesFetched = c.prog.bytes.Load()
	res.WorkDir = workDir
	if !o.KeepWork {
		if err := os.RemoveAll(workDir); err != nil {
			c.log.Warn("cannot remove the work directory", "dir", workDir, "err", err)
		}
	}
	c.prog.phase.Store("done")
	c.stopProgress()
	if o.Progress != nil {
		o.Progress(c.prog.snapshot())
	}
	return res, nil
}

// inspectRelease resolves the release reference and reads its arch,
// version and payload (the image for c.arch when it is a manifest list).
func (c *creator) inspectRelease(ctx context.Context, rel *imageRef) (*releaseInfo, error) {
	var desc *remote.Descriptor
	err := rel.fromRoutes(ctx, c.log, func(repo name.Repository) (err error) {
		if desc, err = c.puller.Get(ctx, rel.refIn(repo)); err != nil {
			return explain(err, repo.RegistryStr(), "release "+rel.String())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rel.digest = desc.Digest.String()
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		if c.arch == "" {
			return nil, fmt.Errorf("%w: %s is a manifest list for several architectures: pass --arch", ErrRelease, rel)
		}
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, explain(err, rel.host(), "release "+rel.String())
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		var child *v1.Descriptor
		for i, m := range im.Manifests {
			if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == bundle.GoArch(c.arch) {
				child = &im.Manifests[i]
				break
			}
		}
		if child == nil {
			return nil, fmt.Errorf("%w: %s has no linux/%s image", ErrRelease, rel, bundle.GoArch(c.arch))
		}
		if img, err = idx.Image(child.Digest); err != nil {
			return nil, explain(err, rel.host(), "release "+rel.String())
		}
	case desc.MediaType.IsImage():
		if img, err = desc.Image(); err != nil {
			return nil, explain(err, rel.host(), "release "+rel.String())
		}
	default:
		return nil, fmt.Errorf("%w: %s has media type %q", ErrRelease, rel, desc.MediaType)
	}
	info, err := readRelease(img)
	if err != nil {
		if errors.Is(err, ErrRelease) {
			return nil, fmt.Errorf("release %s: %w", rel, err)
		}
		return nil, explain(err, rel.host(), "release "+rel.String())
	}
	switch {
	case c.arch == "" && info.Arch == "":
		return nil, fmt.Errorf("%w: %s does not say its architecture: pass --arch", ErrRelease, rel)
	case c.arch == "":
		c.arch = info.Arch
	case info.Arch != "" && info.Arch != c.arch:
		c.log.Warn("--arch overrides the release image's architecture", "flag", c.arch, "image", info.Arch)
	}
	c.log.Info("release image", "ref", rel.String(), "version", info.Version, "arch", info.Arch, "payloadImages", len(info.Payload))
	return info, nil
}

// imagePlan is everything of one image to copy.
type imagePlan struct {
	ref       *imageRef
	repo      string        // path in the tree
	manifests []rawManifest // children before their lists; the image's own last
	blobs     []ocispec.Descriptor
	local     bool // the work tree already held it
}

type rawManifest struct {
	mediaType string
	body      []byte
	digest    digest.Digest
}

// manifestSource fetches a manifest by digest ("" for ref's tag).
type manifestSource func(ctx context.Context, d string) (rawManifest, error)

func (c *creator) plan(ctx context.Context, r *imageRef) (*imagePlan, error) {
	p := &imagePlan{ref: r, repo: c.paths[r.name]}
	src := c.remoteManifests(r)
	if r.digest != "" {
		have, err := c.store.hasManifest(ctx, p.repo, godigest.Digest(r.digest))
		if err != nil {
			return nil, err
		}
		if have {
			src, p.local = c.localManifests(p.repo), true
		}
	}
	top, err := src(ctx, r.digest)
	if err != nil {
		return nil, err
	}
	if r.pin != "" && top.digest != r.pin {
		return nil, fmt.Errorf("%w: %s resolves to %s here, the node that pulled it resolved it to %s: that node's tag moved or this source lies; it is not taken", ErrPinMismatch, r, top.digest, r.pin)
	}
	if r.digest == "" {
		r.digest = top.digest.String()
	}
	seen := map[digest.Digest]bool{}
	if err := c.walk(ctx, p, src, top, seen); err != nil {
		return nil, err
	}
	return p, nil
}

func (c *creator) remoteManifests(r *imageRef) manifestSource {
	return func(ctx context.Context, d string) (rawManifest, error) {
		var m rawManifest
		err := r.fromRoutes(ctx, c.log, func(repo name.Repository) error {
			ref := r.refIn(repo)
			if d != "" {
				ref = repo.Digest(d)
			}
			desc, err := c.puller.Get(ctx, ref)
			if err != nil {
				return explain(err, repo.RegistryStr(), r.String())
			}
			m = rawManifest{mediaType: string(desc.MediaType), body: desc.Manifest, digest: digest.Digest(desc.Digest.String())}
			return nil
		})
		return m, err
	}
}

func (c *creator) localManifests(repo string) manifestSource {
	return func(ctx context.Context, d string) (rawManifest, error) {
		r, err := c.store.repository(ctx, repo)
		if err != nil {
			return rawManifest{}, err
		}
		ms, err := r.Manifests(ctx)
		if err != nil {
			return rawManifest{}, err
		}
		m, err := ms.Get(ctx, godigest.Digest(d))
		if err != nil {
			return rawManifest{}, fmt.Errorf("work tree: manifest %s in %s: %w", d, repo, err)
		}
		mt, body, err := m.Payload()
		if err != nil {
			return rawManifest{}, err
		}
		return rawManifest{mediaType: mt, body: body, digest: digest.Digest(d)}, nil
	}
}

// walk adds m, and for a manifest list the children it keeps, to p.
func (c *creator) walk(ctx context.Context, p *imagePlan, src manifestSource, m rawManifest, seen map[digest.Digest]bool) error {
	if seen[m.digest] {
		return nil
	}
	seen[m.digest] = true
	if err := c.hold(p, m); err != nil {
		return err
	}
	mt := types.MediaType(m.mediaType)
	if mt == "" {
		var probe struct {
			MediaType types.MediaType `json:"mediaType"`
		}
		json.Unmarshal(m.body, &probe)
		mt, m.mediaType = probe.MediaType, string(probe.MediaType)
	}
	switch {
	case mt.IsSchema1():
		return fmt.Errorf("%w: %s uses the Docker schema 1 manifest format, which ferry cannot store: rebuild or re-push it", ErrBadReference, p.ref)
	case mt.IsIndex():
		im, err := v1.ParseIndexManifest(strings.NewReader(string(m.body)))
		if err != nil {
			return fmt.Errorf("%s: manifest list: %w", p.ref, err)
		}
		if len(im.Manifests) > maxChildren {
			return fmt.Errorf("%w: %s is a manifest list of %d manifests, more than the %d ferry takes: its source is not to be trusted", ErrTooLarge, p.ref, len(im.Manifests), maxChildren)
		}
		kept := 0
		for _, d := range im.Manifests {
			if !c.keepChild(d) {
				continue
			}
			if d.Size > maxManifest {
				return fmt.Errorf("%w: %s names a manifest of %d bytes, more than the %d ferry takes", ErrTooLarge, p.ref, d.Size, maxManifest)
			}
			kept++
			child, err := src(ctx, d.Digest.String())
			if err != nil {
				return err
			}
			if err := c.walk(ctx, p, src, child, seen); err != nil {
				return err
			}
		}
		if kept == 0 {
			return fmt.Errorf("%w: %s has no linux/%s image (--platforms %s)", ErrNotFound, p.ref, bundle.GoArch(c.arch), c.o.Platforms)
		}
	case mt.IsImage():
		im, err := v1.ParseManifest(strings.NewReader(string(m.body)))
		if err != nil {
			return fmt.Errorf("%s: manifest: %w", p.ref, err)
		}
		for _, d := range append([]v1.Descriptor{im.Config}, im.Layers...) {
			if len(d.URLs) > 0 && !d.MediaType.IsDistributable() {
				continue // a foreign layer: pulled from its URLs, not from registries
			}
			p.blobs = append(p.blobs, ocispec.Descriptor{MediaType: string(d.MediaType), Digest: godigest.Digest(d.Digest.String()), Size: d.Size})
		}
	default:
		return fmt.Errorf("%w: %s has unsupported media type %q", ErrBadReference, p.ref, m.mediaType)
	}
	p.manifests = append(p.manifests, m)
	return nil
}

// resolvedExtras are the digests the extras given by tag resolved to, by
// the extra as given.
func resolvedExtras(given []string, refs []*imageRef) map[string]digest.Digest {
	out := map[string]digest.Digest{}
	for i, s := range given {
		if _, _, dig := bundle.SplitRef(strings.TrimSpace(s)); dig == "" {
			out[s] = digest.Digest(refs[i].digest)
		}
	}
	return out
}

// Bounds on what a run holds in memory of its sources' manifests: a
// hostile registry (or the node a follower follows) gets a clear error,
// not a node that runs out of memory each time the pull resumes.
const (
	maxManifest      = 4 << 20  // one manifest
	maxChildren      = 128      // a manifest list's manifests
	maxHeldManifests = 64 << 20 // all the run's manifests
)

// ErrTooLarge is a manifest, or all of them, past those bounds.
var ErrTooLarge = errors.New("manifest too large")

// ErrPinMismatch is an extra image's tag that resolves to another digest
// than the one it is pinned to (Options.Pins).
var ErrPinMismatch = errors.New("extra image's tag resolves to another digest")

// hold counts m against the run's bounds.
func (c *creator) hold(p *imagePlan, m rawManifest) error {
	if len(m.body) > maxManifest {
		return fmt.Errorf("%w: %s: a manifest of %d bytes, more than the %d ferry takes", ErrTooLarge, p.ref, len(m.body), maxManifest)
	}
	if n := c.manifestBytes.Add(int64(len(m.body))); n > maxHeldManifests {
		return fmt.Errorf("%w: the release's images have more than %d bytes of manifests: their source is not to be trusted", ErrTooLarge, maxHeldManifests)
	}
	return nil
}

func (c *creator) keepChild(d v1.Descriptor) bool {
	if c.o.Platforms == PlatformsAll {
		return true
	}
	return d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == bundle.GoArch(c.arch)
}

func (c *creator) copyImage(ctx context.Context, p *imagePlan) error {
	for _, b := range p.blobs {
		open := func(from int64) (io.ReadCloser, error) {
			if from > 0 {
				c.log.Info("resuming a blob an earlier run began", "blob", b.Digest.String(), "image", p.ref.String(), "at", from, "of", b.Size)
			}
			rb := &resumingBlob{ctx: ctx, size: b.Size, off: from, pace: c.limit.wait,
				open: func(off int64) (rc io.ReadCloser, err error) {
					err = p.ref.fromRoutes(ctx, c.log, func(repo name.Repository) (err error) {
						rc, err = c.blobs.openAt(ctx, repo, b, off)
						return err
					})
					return rc, err
				},
				onCut: func(off int64, err error) {
					c.log.Warn("a blob's download was cut; resuming where it stopped", "blob", b.Digest.String(), "image", p.ref.String(), "at", off, "of", b.Size, "err", err)
				}}
			return fetchCounter{ReadCloser: rb, n: &c.prog.bytes}, nil
		}
		if err := c.store.ensureBlob(ctx, p.repo, b, open); err != nil {
			return explain(err, p.ref.host(), "blob "+b.Digest.String()+" of "+p.ref.String())
		}
	}
	for i, m := range p.manifests {
		tag := ""
		if i == len(p.manifests)-1 {
			tag = p.ref.tag
		}
		if _, err := c.store.putManifest(ctx, p.repo, m.mediaType, m.body, tag); err != nil {
			return explain(err, p.ref.host(), p.ref.String())
		}
	}
	return nil
}

// checkSpace refuses to start a copy that cannot fit: the blobs the work
// tree lacks, plus the tar when it goes to the same filesystem.
func (c *creator) checkSpace(plans []*imagePlan, workDir string) (missing, total int64, err error) {
	sizes := map[digest.Digest]int64{}
	for _, p := range plans {
		for _, b := range p.blobs {
			sizes[digest.Digest(b.Digest)] = b.Size
		}
	}
	for d, n := range sizes {
		total += n
		if _, err := os.Stat(BlobPath(workDir, d)); err != nil {
			missing += n
		}
	}
	c.prog.bytesTotal.Store(missing)
	need := map[uint64]int64{}
	free := map[uint64]int64{}
	for _, d := range []struct {
		dir string
		n   int64
	}{{workDir, missing}, {c.o.OutputDir, total}} {
		var fi syscall.Stat_t
		n, err := diskspace.Free(d.dir)
		if err != nil || syscall.Stat(d.dir, &fi) != nil {
			return missing, total, nil // cannot tell: let the writes report it
		}
		need[fi.Dev] += d.n
		free[fi.Dev] = n
	}
	for dev, n := range need {
		if n+n/100 > free[dev] {
			return missing, total, fmt.Errorf("%w (disk full): the bundle needs about %s more (%s of images to fetch into %s, a %s tar in %s) and only %s is free: free space or choose other --work-dir/--output",
				ErrDiskFull, bundle.HumanSize(n), bundle.HumanSize(missing), workDir, bundle.HumanSize(total), c.o.OutputDir, bundle.HumanSize(free[dev]))
		}
	}
	return missing, total, nil
}

// writeBundle writes the tar as .tar.partial, renames it, then writes the
// .sha256 and the signature, each atomically.
func (c *creator) writeBundle(meta *bundle.Metadata, workDir string) (*Result, error) {
	base := meta.Name() + ".tar"
	tarPath := filepath.Join(c.o.OutputDir, base)
	partial := tarPath + ".partial"
	f, err := os.OpenFile(partial, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	fail := func(err error) (*Result, error) {
		f.Close()
		os.Remove(partial)
		if errors.Is(err, syscall.ENOSPC) {
			return nil, fmt.Errorf("%w (disk full): no space left writing %s: free space in --output and run again (the copied images are kept in %s)", ErrDiskFull, partial, workDir)
		}
		return nil, fmt.Errorf("bundle: writing %s: %w", partial, err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	var w io.Writer = bw
	sh := bundle.NewSignHash()
	if c.o.SignKey != nil {
		w = io.MultiWriter(bw, sh)
	}
	dgst, size, err := bundle.WriteTar(w, meta, workDir)
	if err != nil {
		return fail(err)
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	res := &Result{Metadata: meta, TarPath: tarPath, Digest: digest.Digest(dgst), TarSize: size,
		SHA256Path: filepath.Join(c.o.OutputDir, meta.Name()+".sha256")}
	sigPath := tarPath + ".minisig"
	// Old sidecars would describe the old tar.
	for _, p := range []string{res.SHA256Path, sigPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			os.Remove(partial)
			return nil, fmt.Errorf("bundle: %w", err)
		}
	}
	if err := os.Rename(partial, tarPath); err != nil {
		os.Remove(partial)
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if err := atomicfile.WriteFile(res.SHA256Path, []byte(bundle.FormatSHA256File(string(dgst), base)), 0o644); err != nil {
		return nil, err
	}
	if c.o.SignKey != nil {
		sig, err := bundle.SignHash(*c.o.SignKey, sh.Sum(nil), dgst)
		if err != nil {
			return nil, err
		}
		if err := atomicfile.WriteFile(sigPath, sig, 0o644); err != nil {
			return nil, err
		}
		res.SignaturePath = sigPath
	}
	atomicfile.SyncDir(c.o.OutputDir)
	c.log.Info("bundle written", "tar", tarPath, "digest", dgst, "size", bundle.HumanSize(size), "images", len(meta.AllImages()))
	return res, nil
}

// ReadImageList reads an --extra-images-file: one reference a line; blank
// lines and everything after a # are ignored.
func ReadImageList(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out, nil
}
