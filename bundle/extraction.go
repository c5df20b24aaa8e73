package bundle

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
)

// extraction is one pass over a bundle's tar (docs/design.md, "The
// bundle"), shaped like distribution's storagedriver.FileWriter: open
// reads metadata.json and runs every check that can run before the pass;
// write reads every other entry, hashing the bytes as they go, checking
// each entry and, with a destination, writing it into the staging dir;
// commit runs the checks that need the digest and the whole tree and
// renames the staging dir into place; cancel drops what a refused run
// wrote; Close lets go of the source.
type extraction struct {
	ctx  context.Context
	src  Source
	name string // the source's, for messages
	dest string // "" verifies only
	opts Options
	log  *slog.Logger

	ap       approval
	in       io.ReadCloser // the source's bytes
	total    int64         // what Options.Progress counts to
	length   int64         // the most bytes the source can give; 0: unknown
	meter    *waitMeter    // with a Pacer: the waits that are this pass's own IO
	resumeAt int64         // entries whose content ends by here are already in the tree; -1: none
	hr       *hashingReader
	tr       *tar.Reader
	// rec holds the tar's bytes of the entry being read, for
	// Options.Index: its own allocation, so that the hashing reader
	// pointing at it holds nothing else of the extraction.
	rec *[]byte

	meta    *Metadata
	approx  bool // meta's size is a seed's ("16 GiB"): bounds allow an eighth more
	w       *treeWriter
	staged  bool  // the staging dir is this run's: cancel may remove it
	lastEnd int64 // where the last entry's content ended
	digest  digest.Digest
}

func newExtraction(ctx context.Context, src Source, dest string, opts Options) *extraction {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &extraction{ctx: ctx, src: src, name: src.Name(), dest: dest, opts: opts, log: log, resumeAt: -1, rec: new([]byte)}
}

// open decides how the bundle can be approved, opens its bytes, reads
// metadata.json and runs the checks that need only it, then prepares the
// tree writer and, with a destination, the staging dir.
func (x *extraction) open() error {
	if x.src.Refused != nil {
		return x.src.Refused
	}
	var err error
	if x.ap, err = decideApproval(x.src, x.opts.Policy); err != nil {
		return err
	}
	if x.in, x.total, x.length, err = openSource(x.src); err != nil {
		return err
	}
	if x.opts.Pacer != nil {
		x.meter = &waitMeter{p: x.opts.Pacer}
	}
	var in io.Reader = x.in
	if file, ok := x.in.(*os.File); ok && x.meter != nil {
		in = meteredReader{file, x.meter} // a stream's waits are the network's, not IO
	}
	if r := x.opts.Resume; r != nil && x.dest != "" {
		x.resumeAt = r.Offset
		in = io.MultiReader(io.NewSectionReader(r.Index.ReaderAt(StagingDir(x.dest)), 0, r.Offset), in)
	}
	var progress func(int64)
	if x.opts.Progress != nil {
		progress = func(done int64) { x.opts.Progress(done, x.total) }
	}
	x.hr = newHashingReader(x.ctx, in, x.ap.mode == ApprovalSignature, progress)
	x.tr = tar.NewReader(x.hr)
	if x.opts.Index != nil {
		x.record()
		*x.opts.Index = Index{}
	}
	x.hr.tee = x.opts.Tee

	hdr, metaBytes, err := x.readMetadata()
	if err != nil {
		return err
	}
	return x.stage(hdr, metaBytes)
}

// readMetadata reads the first entry, metadata.json, and runs every check
// that needs only it.
func (x *extraction) readMetadata() (*tar.Header, []byte, error) {
	hdr, err := x.tr.Next()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: cannot read the first tar entry (%v): not an upgrade bundle, or truncated", ErrInvalid, err)
	}
	x.hr.rec = nil
	meta, metaBytes, err := readMetadataEntry(x.tr, hdr)
	if err != nil {
		return nil, nil, err
	}
	x.meta = meta
	if o := x.opts.Expect; o != nil && !SameMetadata(meta, o) {
		return nil, nil, fmt.Errorf("%w: the tar's metadata.json (%s, %s) is not what the offer it was fetched on said (%s, %s): a peer offering one bundle and sending another; nothing was written",
			ErrInvalid, meta.Version, HumanSize(meta.SizeBytes), o.Version, HumanSize(o.SizeBytes))
	}
	if x.src.Raw {
		x.total = meta.SizeBytes
	}
	x.approx = meta.Shape == ShapeSeed && meta.SizeBytes > 0
	if meta.Shape == ShapeSeed {
		if meta.SizeBytes == 0 {
			meta.SizeBytes = x.total // the tar's own length serves the space checks
		}
		if len(meta.Duplicates) > 0 {
			x.log.Warn("metadata.json lists images more than once; each is counted once", "bundle", x.name, "images", strings.Join(meta.Duplicates, " "))
		}
	}
	if a := x.opts.Arch; a != "" && meta.Arch != a {
		return nil, nil, fmt.Errorf("%w: the bundle is for %s, this node is %s: bring the %s bundle of version %s",
			ErrWrongArch, meta.Arch, a, a, meta.Version)
	}
	if x.ap.mode == ApprovalOff {
		x.log.Warn("approval is off: accepting any bundle whose sha256 checks; set approved_digests or trusted_keys", "bundle", x.name)
	}
	return hdr, metaBytes, nil
}

// stage makes the tree writer, bounded by what the metadata and the
// source allow, and, with a destination, checks the room for the bundle
// and prepares the staging dir with metadata.json in it.
func (x *extraction) stage(hdr *tar.Header, metaBytes []byte) error {
	o, meta := x.opts, x.meta
	x.w = &treeWriter{meta: meta, resuming: x.resumeAt >= 0, limit: writeBound(meta.SizeBytes, x.approx, x.length), writeBehind: o.Sync}
	if o.MaxWrite > 0 && (x.w.limit <= 0 || o.MaxWrite < x.w.limit) {
		x.w.limit = o.MaxWrite
	}
	if o.Pacer != nil {
		x.w.pace = func(n int) error { return o.Pacer.Pace(x.ctx, n) }
		x.w.wait = x.meter
	}
	if x.dest != "" {
		room := meta.SizeBytes
		if meta.Shape == ShapeSeed && x.w.limit > 0 {
			room = x.w.limit // what may be written is what needs room
		}
		if err := checkSpace(filepath.Dir(x.dest), room, o.SpaceFactor); err != nil {
			return err
		}
		x.w.root = StagingDir(x.dest)
		if err := prepareStaging(x.w, metaBytes, x.resumeAt >= 0); err != nil {
			return err
		}
		x.staged = true
	}
	if err := x.index(MetadataName, hdr.Size); err != nil {
		return err
	}
	x.w.total = hdr.Size
	x.lastEnd = x.hr.consumed
	return nil
}

// write reads every entry after metadata.json up to the end-of-archive
// marker, each hashed, checked and (with a destination) written, then
// what follows the marker, and finishes the digest.
func (x *extraction) write() error {
	bound := entryBound{entries: 1} // metadata.json
	for {
		*x.rec = (*x.rec)[:0]
		x.record()
		hdr, err := x.tr.Next()
		x.hr.rec = nil
		if err == io.EOF {
			break
		}
		if err != nil {
			return readErr(err)
		}
		if err := bound.count(hdr.Name); err != nil {
			return err
		}
		x.w.replayed = x.hr.consumed <= x.resumeAt
		if err := x.w.entry(x.tr, hdr); err != nil {
			return err
		}
		p := ""
		if hdr.Typeflag == tar.TypeReg {
			p = path.Clean(hdr.Name)
		}
		if err := x.index(p, hdr.Size); err != nil {
			return err
		}
		x.lastEnd = x.hr.consumed
		if x.opts.Checkpoint != nil && !x.w.replayed {
			x.opts.Checkpoint(x.lastEnd)
		}
	}
	return x.end()
}

// end checks the end-of-archive marker and what follows it (nothing, or a
// seed-shaped bundle's zero padding), and finishes the digest.
func (x *extraction) end() error {
	if got := x.hr.consumed - align512(x.lastEnd); got != 1024 {
		return fmt.Errorf("%w: truncated: the end-of-archive marker is incomplete: the copy stopped early; copy the bundle again", ErrInvalid)
	}
	if x.meta.Shape == ShapeSeed {
		if err := x.padding(); err != nil {
			return err
		}
	} else if !x.src.Raw {
		more, err := x.hr.trailing()
		if err != nil {
			return readErr(err)
		}
		if more {
			return errTrailing
		}
	}
	if err := x.index("", 0); err != nil {
		return err
	}
	if x.digest == "" {
		x.digest = x.hr.finish()
	}
	return nil
}

var errTrailing = fmt.Errorf("%w: bytes follow the end-of-archive marker: the file was altered or badly copied; copy the bundle again", ErrInvalid)

// padding takes a seed-shaped bundle's GNU tar record padding (zeros)
// after the end-of-archive marker as the bundle's. In a file it is part
// of the file and of its sha256sum: consumed, and digest, pieces and
// index include it. On a stick read raw it is the bundle's when the
// digest with it is the approved one.
func (x *extraction) padding() error {
	if !x.src.Raw {
		x.record()
		pad, ok, err := x.hr.consumeZeroPadding()
		x.hr.rec = nil
		if err != nil {
			return readErr(err)
		}
		if !ok {
			return errTrailing
		}
		if pad > 0 {
			x.log.Info("zero record padding after the end-of-archive marker (GNU tar) is part of the bundle", "bundle", x.name, "bytes", pad)
		}
		return nil
	}
	digest, pad, err := x.hr.finishPeek(int(align(x.hr.consumed, gnuRecord) - x.hr.consumed))
	if err != nil {
		return readErr(err)
	}
	x.digest = digest
	if padded := x.hr.digestWith(pad); isZeros(pad) && len(pad) > 0 && x.ap.approves(padded) && !x.ap.approves(digest) {
		x.digest = padded
		x.hr.consumed += int64(len(pad))
		*x.rec = append(*x.rec, pad...)
		if x.opts.Tee != nil {
			x.opts.Tee.Write(pad)
		}
		x.log.Info("zero record padding after the end-of-archive marker (GNU tar) is part of the bundle", "bundle", x.name, "bytes", len(pad))
	}
	return nil
}

// commit runs the checks that need the digest and the whole tree, asks
// Options.Admit, and, with a destination, renames the staging dir into
// place.
func (x *extraction) commit() (*Result, error) {
	if err := x.ap.check(x.digest, x.hr); err != nil {
		return nil, err
	}
	if x.w.ix == nil {
		x.w.ix = newTreeIndex() // no entry after metadata.json
	}
	if err := x.w.ix.check(x.meta); err != nil {
		return nil, err
	}
	if x.opts.Payload != nil && x.dest != "" {
		if err := checkPayload(x.w.root, x.meta, x.tree(), *x.opts.Payload); err != nil {
			return nil, err
		}
	}
	var adm Admission
	if x.opts.Admit != nil {
		var err error
		if adm, err = x.opts.Admit(x.meta, x.tree()); err != nil {
			return nil, err
		}
	}
	res := &Result{Metadata: x.meta, Digest: x.digest, TarSize: x.hr.consumed, Approval: x.ap.mode, Signature: x.ap.travels, Admission: adm}
	if x.opts.Index != nil {
		x.opts.Index.Size = x.hr.consumed
		x.opts.Index.Digest = x.digest
	}
	if x.dest != "" {
		if err := x.w.publish(x.dest, x.opts.Sync); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// cancel drops what a run that failed with err wrote: the staging dir,
// unless the bundle was not refused and a Checkpoint lets a resume go on
// from it. It returns err, naming the bundle.
func (x *extraction) cancel(err error) error {
	if x.staged && (x.opts.Checkpoint == nil || IsRefusal(err)) {
		os.RemoveAll(x.w.root)
	}
	return fmt.Errorf("bundle %s: %w", x.name, err)
}

// Close lets go of the tree writer, the hashing reader and the source.
func (x *extraction) Close() {
	if x.w != nil {
		x.w.close()
	}
	if x.hr != nil {
		x.hr.close(false)
	}
	if x.in != nil {
		x.in.Close()
	}
}

// record has the hashing reader keep the bytes it reads in x.rec, for
// the Index.
func (x *extraction) record() {
	if x.opts.Index != nil {
		x.hr.rec = x.rec
	}
}

// index adds the bytes recorded to Options.Index, as the entry p of size
// bytes ("" for none).
func (x *extraction) index(p string, size int64) error {
	if x.opts.Index == nil {
		return nil
	}
	return x.opts.Index.add(slices.Clone(*x.rec), p, size)
}

// tree is the tree check's view of the tree, for the checks of what it
// holds.
func (x *extraction) tree() Tree {
	return Tree{ix: x.w.ix, repos: RepoPaths(x.meta.AllImages())}
}
