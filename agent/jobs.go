package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
)

// Jobs and probes run off the loop and return the event that reports
// their end. They read what the effect carries and touch no state.

// errNoBundle: a device or file that holds no upgrade bundle.
var errNoBundle = errors.New("no upgrade bundle here")

// probe opens a stick (or a file given to ferry load) and reads its
// metadata. A raw device with no .sha256 says its digest only when read
// whole: that long read happens here, never on the loop, and only when the
// node holds a bundle to compare it with.
func (a *Agent) probe(ctx context.Context, p machine.EffProbe) machine.Event {
	o := machine.EvOffer{Origin: p.Origin, Device: p.Ev.Device, Reply: p.Reply}
	if p.Origin == machine.OriginFile {
		o.Src, o.Medium = a.handles.medium(p.Medium).Bundles()[0], p.Medium
	} else {
		m, err := a.deps.Media.Open(ctx, p.Ev)
		if err != nil {
			o.NoBundle, o.Err = true, err
			return o
		}
		srcs := m.Bundles()
		if len(srcs) == 0 {
			m.Close()
			o.NoBundle, o.Err = true, errNoBundle
			return o
		}
		a.log.Info("upgrade stick found", "device", p.Ev.Device, "bundles", len(srcs))
		o.Src, o.Medium = srcs[0], a.handles.addMedium(m)
	}
	if o.Src.Refused != nil {
		// A file on the stick ferry does not read (a link, a FIFO…):
		// refused with its reason, nothing opened.
		o.Err = fmt.Errorf("bundle %s: %w", o.Src.Name(), o.Src.Refused)
		return o
	}
	o.Meta, o.Err = bundle.InspectFile(o.Src.Path)
	if o.Err != nil {
		return o
	}
	o.Digest = sidecarDigest(o.Src)
	if o.Digest == "" && p.Held != "" && o.Src.Raw {
		a.log.Info("reading the whole stick to compare it with the bundle held", "device", p.Ev.Device, "bundle", o.Src.Name())
		res, err := bundle.Verify(ctx, o.Src, bundle.Options{Policy: bundle.Policy{SpaceFactor: -1, ApprovedDigests: []string{string(p.Held)}}})
		switch {
		case err == nil && res.Digest == p.Held:
			o.Digest = p.Held
		case err == nil || bundle.IsRefusal(err):
			o.Differs = true
		default:
			// Unreadable (pulled mid-read): neither the same nor a conflict.
			o.NoBundle, o.Err = true, err
		}
	}
	return o
}

// sidecarDigest is the digest a source's .sha256 claims, if any.
func sidecarDigest(src bundle.Source) digest.Digest {
	if src.SHA256Path == "" {
		return ""
	}
	b, err := bundle.ReadSidecar(src.SHA256Path, "the .sha256 file of "+src.Name())
	if err != nil {
		return ""
	}
	d, err := bundle.ParseSHA256Line(b, src.Name())
	if err != nil {
		return ""
	}
	return d
}

// runJob runs one job to its end.
func (a *Agent) runJob(ctx context.Context, j machine.EffStartJob) machine.Event {
	r := j.Rec // a copy (perform)
	done := machine.EvJobDone{Kind: j.Kind, ID: r.ID}
	switch j.Kind {
	case machine.JobExtract:
		var pl *peer.PieceList
		done.Res, pl, done.Err = a.extractJob(ctx, r, j)
		a.handles.setPieces(r.ID, pl)
	case machine.JobFetch:
		var pl *peer.PieceList
		done.Res, pl, done.Err = a.fetchJob(ctx, r, j)
		a.handles.setPieces(r.ID, pl)
	case machine.JobLoad:
		p := a.throttle(r.ID, "images")
		done.Err = a.deps.Loader.Load(ctx, r.Metadata, r.Images(), r.Dir, j.Keep, func(d, t int) { p(int64(d), int64(t)) })
	case machine.JobCleanup:
		done.Err = a.cleanupJob(ctx, r, j.Unload)
	case machine.JobRetire:
		done.Err = a.retireJob(ctx, r, j)
	case machine.JobRestore:
		done.Restored, done.Err = a.restore(ctx, r)
	}
	done.Stopped = ctx.Err() != nil
	return done
}

func (a *Agent) extractJob(ctx context.Context, r *machine.Record, j machine.EffStartJob) (*bundle.Result, *peer.PieceList, error) {
	again := "then plug the stick in again"
	switch r.Origin {
	case machine.OriginFile:
		again = "then run ferry load again"
	case machine.OriginPeer:
		again = "then it is fetched again by itself"
	}
	if r.Origin != machine.OriginPeer {
		if err := a.preflight(ctx, r); err != nil {
			return nil, nil, err
		}
	}
	if err := a.roomBefore(ctx, r, map[string]int64{a.cfg.Paths.ExtractDir: r.Metadata.SizeBytes}, again); err != nil {
		return nil, nil, err
	}
	var ix bundle.Index
	opts := a.extractOptions(r, j.Policy, &ix)
	opts.Progress = a.throttle(r.ID, "bytes")
	var hasher interface {
		io.Writer
		List(digest digest.Digest) *peer.PieceList
	}
	if a.deps.Peers != nil && j.Pieces {
		// The piece list for the peers, hashed in the same pass; offered
		// piece by piece as it is (cut-through) when the digest is known
		// before the read. A fetched bundle's shelf entry keeps the list
		// it was fetched and checked with.
		hasher = peer.NewPieceHasher(peer.DefaultPieceSize)
		if live := a.shareLive(r, j.Src); live != nil {
			// Withdrawn at the end either way: refused, the peers drop it;
			// extracted, the tree's offer (effShare) replaces it, and the
			// stick can be unmounted.
			defer live.Close()
			hasher = live
		}
		opts.Tee = hasher
	}
	res, err := bundle.Extract(ctx, j.Src, r.Dir, opts)
	if err != nil {
		return nil, nil, err
	}
	a.keepIndex(r, res, &ix)
	var pieces *peer.PieceList
	if hasher != nil {
		pieces = hasher.List(res.Digest)
	}
	return res, pieces, nil
}

// extractOptions are those of every extraction of r (from a stick, a
// file, or streamed from the peers).
func (a *Agent) extractOptions(r *machine.Record, pol bundle.Policy, ix *bundle.Index) bundle.Options {
	opts := bundle.Options{Policy: pol, Sync: true, Index: ix, Admit: a.deps.Admit, Log: a.log}
	if a.deps.Pacer != nil {
		opts.Pacer = a.deps.Pacer
	}
	if a.deps.Loader != nil && opts.SpaceFactor == 0 {
		// The tree itself where it extracts: its load, and the tree when
		// it shares the image store's filesystem, were checked before
		// against what the kubelet tolerates (the 2 × of extraction
		// alone stood for both).
		opts.SpaceFactor = 1
	}
	return opts
}

// keepIndex writes the tar index with which the tree is served again.
func (a *Agent) keepIndex(r *machine.Record, res *bundle.Result, ix *bundle.Index) {
	if err := ix.WriteFile(a.store.IndexPath(res.Digest)); err != nil {
		a.log.Warn("cannot keep the tar index; peers will not be served", "bundle", r.Name, "err", err)
	}
}

// shareLive offers a stick's bundle to the peers while this node reads
// it (cut-through), under the digest its .sha256 names: the digest the
// read must end with, or the offer is withdrawn. nil when the digest is
// not known before the read (a raw device without one learns it at the
// end), in serial mode, or when the file cannot be opened twice.
func (a *Agent) shareLive(r *machine.Record, src bundle.Source) *peer.LiveHasher {
	d := sidecarDigest(src)
	if src.Raw || a.cfg.Peer.Serial || d == "" || r.Metadata == nil {
		return nil
	}
	f, err := os.Open(src.Path)
	if err != nil {
		a.log.Warn("cannot offer the bundle to the peers while it is read; they fetch it once it is extracted", "bundle", r.Name, "err", err)
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil
	}
	var sig []byte
	if src.SigPath != "" {
		sig, _ = bundle.ReadSignature(src.SigPath, "the .minisig file of "+src.Name()) // only a signature travels
	}
	meta, _ := json.Marshal(r.Metadata)
	live, err := a.deps.Peers.ShareLive(d, meta, sig, f, fi.Size())
	if err != nil {
		f.Close()
		a.log.Warn("cannot offer the bundle to the peers while it is read; they fetch it once it is extracted", "bundle", r.Name, "err", err)
		return nil
	}
	a.log.Info("offering the bundle to the peers while it is read (cut-through)", "bundle", r.Name, "digest", d)
	return live
}

// fetchJob gets the bundle from the peers and extracts it as its bytes
// arrive (cut-through): the disk holds its tree and at most a window of
// the tar (peer.StreamWindow), never the whole tar. The sidecars are
// written first, so that the extraction checks the digest in its own
// pass, and the signature that came with the offer when this node
// approved the bundle by it. After a restart it resumes from the
// extraction's last checkpoint (peer.FetchStream). In serial mode it
// keeps the whole tar and the extraction is a job of its own.
func (a *Agent) fetchJob(ctx context.Context, r *machine.Record, j machine.EffStartJob) (*bundle.Result, *peer.PieceList, error) {
	if a.cfg.Peer.Serial {
		return nil, nil, a.fetchWhole(ctx, r)
	}
	dest := a.m.IncomingPath(r)
	window := peer.StreamWindow(r.Metadata.SizeBytes)
	admitted := fetchBound(r)
	writes := map[string]int64{a.cfg.Paths.ExtractDir: admitted}
	writes[a.cfg.Paths.StateDir] += window
	if err := a.roomBefore(ctx, r, writes, "then it is fetched by itself (tried every 10 s)"); err != nil {
		return nil, nil, err
	}
	src, err := a.writeSidecars(r, dest)
	if err != nil {
		return nil, nil, err
	}
	var ix bundle.Index
	var res *bundle.Result
	p := a.throttle(r.ID, "bytes")
	_, err = a.deps.Peers.FetchStream(ctx, r.Digest, dest, window, func(pr peer.Progress) { p(pr.Done, pr.Total) },
		func(rd io.Reader, from *peer.StreamResume, checkpoint peer.Checkpoint) error {
			opts, err := a.streamOptions(r, j.Policy, &ix, from, checkpoint)
			if err != nil {
				return err
			}
			// Everything is bounded by the offer the checks ran on: the
			// tar must carry the same metadata, and writes no more than
			// the room admitted.
			opts.Expect, opts.MaxWrite = r.Metadata, admitted
			src.Reader, src.Size = rd, r.TarSize // the offer's length bounds the writes too
			res, err = bundle.Extract(ctx, src, r.Dir, opts)
			return err
		})
	if err != nil {
		return nil, nil, err
	}
	a.keepIndex(r, res, &ix)
	return res, nil, nil // the shelf keeps the list it was fetched with
}

// fetchBound is what a fetch of r may write, checked for room before it
// starts: its offer's metadata's size (an eighth more when that size is
// approximate, as the extraction allows), else the offer's tar length.
func fetchBound(r *machine.Record) int64 {
	n := r.Metadata.SizeBytes
	if n > 0 && r.Metadata.Shape == bundle.ShapeSeed {
		n += n / 8
	}
	if n <= 0 || r.TarSize > 0 && r.TarSize < n {
		n = r.TarSize
	}
	return n
}

// streamOptions are the options of an extraction fed by a streaming
// fetch: resumed from where the fetch's record says it had got to, and
// telling the fetch where it gets to, entry by entry (the tar index so
// far, encoded only when the fetch writes its record).
func (a *Agent) streamOptions(r *machine.Record, pol bundle.Policy, ix *bundle.Index, from *peer.StreamResume, checkpoint peer.Checkpoint) (bundle.Options, error) {
	opts := a.extractOptions(r, pol, ix)
	if from != nil {
		var old bundle.Index
		if err := old.Decode(from.Data); err != nil {
			return opts, fmt.Errorf("resuming the extraction of %s: %w; it starts over", r.Name, err)
		}
		opts.Resume = &bundle.Resume{Index: &old, Offset: from.Offset}
		a.log.Info("resuming the extraction where it stopped", "bundle", r.Name, "bytes", from.Offset)
	}
	opts.Checkpoint = func(off int64) {
		// The segments so far never change: the index only grows.
		snap := ix.Snapshot()
		checkpoint(off, func() []byte {
			b, _ := snap.Encode()
			return b
		})
	}
	return opts, nil
}

// writeSidecars writes the .sha256 of the digest this node asked for and
// the .minisig that came with the offer beside dest, the bundle's source
// for its extraction.
func (a *Agent) writeSidecars(r *machine.Record, dest string) (bundle.Source, error) {
	src := bundle.Source{Path: dest, SHA256Path: strings.TrimSuffix(dest, ".tar") + ".sha256"}
	if err := os.MkdirAll(filepath.Dir(dest), 0o700); err != nil {
		return src, err
	}
	if r.Signature != nil {
		if err := os.WriteFile(dest+".minisig", r.Signature, 0o600); err != nil {
			return src, err
		}
	}
	if r.Approval == bundle.ApprovalSignature {
		src.SigPath = dest + ".minisig"
	}
	return src, os.WriteFile(src.SHA256Path, []byte(bundle.FormatSHA256File(string(r.Digest), filepath.Base(dest))), 0o600)
}

// fetchWhole gets the whole tar from the peers (serial mode).
func (a *Agent) fetchWhole(ctx context.Context, r *machine.Record) error {
	dest := a.m.IncomingPath(r)
	if _, err := os.Stat(dest); os.IsNotExist(err) {
		// The tar where it lands, then its tree where it extracts.
		writes := map[string]int64{a.cfg.Paths.ExtractDir: r.Metadata.SizeBytes}
		writes[a.cfg.Paths.StateDir] += r.Metadata.SizeBytes
		if err := a.roomBefore(ctx, r, writes, "then it is fetched by itself (tried every 10 s)"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o700); err != nil {
		return err
	}
	p := a.throttle(r.ID, "bytes")
	if err := a.deps.Peers.Fetch(ctx, r.Digest, dest, func(pr peer.Progress) { p(pr.Done, pr.Total) }); err != nil {
		return err
	}
	_, err := a.writeSidecars(r, dest)
	return err
}

// roomBefore checks, before a bundle's bytes are written on this node
// (writes: bytes by directory), that there is room for them and for its
// load within what the kubelet tolerates (Loader.CheckRoomBefore); a
// refusal ends with what comes after freeing space (again).
func (a *Agent) roomBefore(ctx context.Context, r *machine.Record, writes map[string]int64, again string) error {
	if a.deps.Loader == nil || r.Metadata == nil {
		return nil
	}
	for dir := range writes {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := a.deps.Loader.CheckRoomBefore(ctx, r.Metadata, writes); err != nil {
		return fmt.Errorf("bundle %s: %w; %s", r.Name, err, again)
	}
	return nil
}

// cleanupJob takes a bundle out of CRI-O, stops sharing it and removes its
// files.
func (a *Agent) cleanupJob(ctx context.Context, r *machine.Record, unload bool) error {
	if unload {
		if err := a.deps.Loader.Cleanup(ctx, r.Metadata, r.Dir); err != nil {
			return err
		}
	}
	if r.Dir != "" {
		if err := os.RemoveAll(r.Dir); err != nil {
			return err
		}
	}
	if a.deps.Peers != nil && r.Digest != "" {
		a.deps.Peers.Unshare(r.Digest)
	}
	if r.Digest != "" {
		os.Remove(a.store.IndexPath(r.Digest))
	}
	return nil
}

// retireJob ends a bundle whose upgrade is done: registry, mirror and CA go
// (pins stay); its files and sharing go too unless the node keeps it as
// the running release's source (j.retain). The previous bundle's pins go,
// except the images this one holds too, and so does the tree kept for it.
func (a *Agent) retireJob(ctx context.Context, r *machine.Record, j machine.EffStartJob) error {
	if j.Unload {
		if err := a.deps.Loader.Retire(ctx, r.Metadata, r.Dir); err != nil {
			return err
		}
	}
	if !j.Retain {
		if err := a.cleanupJob(ctx, r, false); err != nil {
			return err
		}
	}
	p := j.Previous
	if p == nil {
		return nil
	}
	if j.Unload && p.Metadata != nil {
		a.log.Info("unpinning the previous bundle's images", "bundle", p.Name, "images", len(p.Images()))
		if err := a.deps.Loader.Unpin(ctx, p.Metadata, p.Images()); err != nil {
			return err
		}
	}
	if p.Retained && p.Dir != r.Dir {
		a.log.Info("removing the copy kept of the previous release", "bundle", p.Name, "dir", p.Dir)
		return a.cleanupJob(ctx, p, false)
	}
	return nil
}

// restore loads the running release's images CRI-O lacks again from the
// tree kept for it.
func (a *Agent) restore(ctx context.Context, r *machine.Record) (int, error) {
	return a.deps.Loader.Restore(ctx, r.Metadata, r.Images(), r.Dir)
}

// throttle returns a progress callback that tells the loop at most every
// 500 ms (and at the end); a report the loop has no room for is dropped,
// the next one carries the news.
func (a *Agent) throttle(id, unit string) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		if now := time.Now(); now.Sub(last) > 500*time.Millisecond || done == total {
			last = now
			select {
			case a.progress <- machine.EvProgress{ID: id, P: machine.Progress{Done: done, Total: total, Unit: unit}}:
			default:
			}
		}
	}
}

// share puts an extracted bundle on the shelf for the peers, with pieces
// if its piece list was hashed in the extraction pass.
func (a *Agent) share(r *machine.Record, pieces *peer.PieceList) {
	if a.deps.Peers == nil || r.Metadata == nil {
		return
	}
	ix, err := bundle.ReadIndex(a.store.IndexPath(r.Digest))
	if err != nil {
		a.log.Warn("cannot serve the bundle to peers: no tar index", "bundle", r.Name, "err", err)
		return
	}
	meta, _ := json.Marshal(r.Metadata)
	if err := a.deps.Peers.Share(r.Digest, meta, r.Signature, ix.ReaderAt(r.Dir), ix.Size, pieces); err != nil {
		a.log.Warn("cannot serve the bundle to peers", "bundle", r.Name, "err", err)
	}
}

// runHook runs on_ready, which the machine marked started.
func (a *Agent) runHook(ctx context.Context, r *machine.Record) machine.Event {
	argv := a.cfg.Cluster.OnReady
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "FERRY_RELEASE="+r.Metadata.Release, "FERRY_VERSION="+r.Metadata.Version, "FERRY_DIGEST="+string(r.Digest))
	out := &logWriter{log: a.log.With("hook", "on_ready", "bundle", r.Name)}
	cmd.Stdout, cmd.Stderr = out, out
	a.log.Info("running the on_ready hook", "bundle", r.Name, "argv", strings.Join(argv, " "))
	err := cmd.Run()
	out.flush()
	run := *r.Hook
	run.Finished = a.deps.Now().UTC()
	run.Exit = cmd.ProcessState.ExitCode()
	if err != nil {
		run.Error = fmt.Sprintf("on_ready hook: %v", err)
	}
	return machine.EvHookDone{ID: r.ID, Run: run}
}
