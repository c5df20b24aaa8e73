package bundle

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/diskspace"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Options tune one verify or extract run.
type Options struct {
	Policy
	// Progress is called as bytes are read (done, total); total is the
	// file size, or metadata's sizeBytes for a raw device.
	Progress func(done, total int64)
	// Sync flushes the extracted tree to disk before it appears; its
	// files are written back as they are written (writeBehind), so that
	// little is left for that flush.
	Sync bool
	// Index, when set, receives the layout of the tar so that its bytes
	// can be served again from the extracted tree (see Index).
	Index *Index
	// Tee, when set, also receives the tar's bytes up to its end marker,
	// in order, in the pass that hashes them and on another core (the
	// agent hashes the peers' piece list there). A refused bundle may have
	// written part of its bytes to it.
	Tee io.Writer
	// Resume, when set, continues an extraction into dest's staging dir
	// that a stop interrupted (a streaming fetch restarted): the tar's
	// bytes [0, Offset) are read back from the staging tree as its Index
	// says, checked again like any (digest, blobs, tree) but not written
	// again, and the source gives the bytes from Offset on.
	Resume *Resume
	// Checkpoint, when set, is called on the extraction's goroutine each
	// time the staging tree holds the tar's bytes [0, offset), which
	// Index (required with it) then tells how to read back: what a
	// Resume needs. A run that stops without refusing the bundle keeps
	// its staging dir for that resume.
	Checkpoint func(offset int64)
	// Admit, when set, is asked once the digest and the tree have
	// checked, before anything leaves the staging dir: an error (wrap
	// ErrPolicy) refuses the bundle; an Admission narrows what the node
	// pulls of it (Result.Admission). The node's signature policy runs
	// here.
	Admit func(meta *Metadata, tree Tree) (Admission, error)
	// Pacer, when set, is asked after each chunk written to the tree:
	// it pauses the extraction while the node's other work stalls
	// (internal/pacing). It costs one atomic load when the node is quiet.
	Pacer Pacer
	// Expect, when set, is the metadata the bundle was admitted on (a
	// peer's offer, which the room and approval checks read): a tar whose
	// own metadata.json says otherwise is refused at its first entry,
	// before a byte of the tree is written.
	Expect *Metadata
	// MaxWrite, when above 0, bounds the bytes of files written: what the
	// room check admitted for the source (a peer's offer).
	MaxWrite int64
	Log      *slog.Logger
}

// Pacer slows bulk work while the node is under pressure.
type Pacer interface {
	// Pace pauses for n bytes of bulk work, or until ctx ends.
	Pace(ctx context.Context, n int) error
	// Waited says the work waited d off the CPU in a system call for its
	// own IO: the node's IO pressure counts those waits, and they are not
	// anyone else's.
	Waited(d time.Duration)
}

// Resume is where an interrupted extraction got to (Options.Resume).
type Resume struct {
	Index  *Index
	Offset int64
}

// Verify checks src without writing anything.
func Verify(ctx context.Context, src Source, opts Options) (*Result, error) {
	return run(ctx, src, "", opts)
}

// Extract checks src and, in the same pass, writes its entries under a
// staging directory next to dest, renamed to dest only when every check
// passed. dest must not exist.
func Extract(ctx context.Context, src Source, dest string, opts Options) (*Result, error) {
	if dest == "" {
		return nil, errors.New("extract: no destination")
	}
	if _, err := os.Lstat(dest); err == nil {
		return nil, fmt.Errorf("extract: %s already exists; remove it or choose another --dest", dest)
	}
	return run(ctx, src, dest, opts)
}

// ReadMetadata reads only the first entry of a bundle tar.
func ReadMetadata(r io.Reader) (*Metadata, error) {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("%w: cannot read the first tar entry (%v): this is not an upgrade bundle, or it is truncated", ErrInvalid, err)
	}
	m, _, err := readMetadataEntry(tr, hdr)
	return m, err
}

func readMetadataEntry(tr *tar.Reader, hdr *tar.Header) (*Metadata, []byte, error) {
	if hdr.Name != MetadataName || hdr.Typeflag != tar.TypeReg {
		return nil, nil, fmt.Errorf("%w: first entry is %q, not the regular file %s: this is not an upgrade bundle", ErrInvalid, hdr.Name, MetadataName)
	}
	if hdr.Size > maxMetadataSize {
		return nil, nil, fmt.Errorf("%w: %s is %d bytes, over the %d limit", ErrInvalid, MetadataName, hdr.Size, maxMetadataSize)
	}
	b, err := io.ReadAll(tr)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: reading %s: %v", ErrInvalid, MetadataName, err)
	}
	m, err := ParseMetadata(b)
	return m, b, err
}

// InspectFile reads metadata.json of the bundle at path (tar or device).
func InspectFile(path string) (*Metadata, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadMetadata(f)
}

// prepareStaging makes w's staging dir with metadata.json in it, or
// keeps the one an interrupted run left when resuming it.
func prepareStaging(w *treeWriter, metaBytes []byte, resume bool) error {
	if resume {
		if _, err := os.Stat(filepath.Join(w.root, MetadataName)); err != nil {
			return fmt.Errorf("resuming the extraction: %w", err)
		}
		return nil
	}
	if err := os.RemoveAll(w.root); err != nil {
		return err
	}
	if err := os.MkdirAll(w.root, 0o755); err != nil {
		return err
	}
	return w.writeFile(MetadataName, metaBytes)
}

// openSource opens the bundle's bytes and says their length (0 for a
// raw device: it is learned from the metadata) and how many bytes the
// source can give at most (the file's or the device's length, a
// reader's Size; 0 when unknown): a bound on what is written from it.
func openSource(src Source) (rc io.ReadCloser, total, length int64, err error) {
	if src.Reader != nil {
		return io.NopCloser(src.Reader), src.Size, src.Size, nil
	}
	f, err := os.Open(src.Path)
	if err != nil {
		return nil, 0, 0, err
	}
	if src.Raw {
		// A block device's length is where a seek to its end lands.
		if n, serr := f.Seek(0, io.SeekEnd); serr == nil && n > 0 {
			length = n
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			f.Close()
			return nil, 0, 0, err
		}
		return f, 0, length, nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, 0, err
	}
	return f, fi.Size(), fi.Size(), nil
}

// writeBound is the most bytes of files an extraction may write before the
// digest has matched (docs/design.md, "Bounds before the digest"): the
// smaller of the size the metadata claims and the source's length, each when
// known. A seed-shaped size ("16 GiB") is approximate: it bounds with an
// eighth more. 0: no bound known (verify only, or nothing to bound by).
func writeBound(claimed int64, approx bool, length int64) int64 {
	if approx {
		claimed = satAdd(claimed, claimed/8)
	}
	switch {
	case claimed <= 0:
		return max(length, 0)
	case length <= 0:
		return claimed
	}
	return min(claimed, length)
}

// satAdd is a + b for non-negative a and b, saturating at MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul is a × b for non-negative a and b, saturating at MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// approval is what was decided about approval before the pass.
type approval struct {
	mode     Approval
	atEnd    bool   // ApprovalDigest of a source with no .sha256: checked once hashed
	sig      []byte // signature to verify at the end
	travels  []byte // the .minisig, verified here or not, for the peers
	keys     []minisign.PublicKey
	approved []digest.Digest // normalized approved digests
	expected digest.Digest   // digest from .sha256, "" for none
}

// run verifies src in one pass and, with a destination, extracts it
// (extraction.go).
func run(ctx context.Context, src Source, dest string, opts Options) (*Result, error) {
	x := newExtraction(ctx, src, dest, opts)
	defer x.Close()
	if err := x.open(); err != nil {
		return nil, x.cancel(err)
	}
	if err := x.write(); err != nil {
		return nil, x.cancel(err)
	}
	res, err := x.commit()
	if err != nil {
		return nil, x.cancel(err)
	}
	return res, nil
}

func align512(n int64) int64 { return align(n, 512) }

// gnuRecord is GNU tar's default record: it pads archives to a multiple.
const gnuRecord = 10240

func align(n, to int64) int64 { return (n + to - 1) / to * to }

func isZeros(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// readErr turns a tar reading error into a message a technician can act on.
func readErr(err error) error {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: truncated: the file ends in the middle of an entry; copy the bundle again", ErrInvalid)
	case errors.Is(err, tar.ErrHeader), errors.Is(err, tar.ErrInsecurePath):
		return fmt.Errorf("%w: damaged tar header (%v); copy the bundle again", ErrInvalid, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("reading the bundle failed (%w): if the stick was pulled, plug it in again", err)
}

func decideApproval(src Source, p Policy) (approval, error) {
	var ap approval
	for _, d := range append(slices.Clone(p.ApprovedDigests), string(p.ApprovedByPeer)) {
		if n := NormalizeDigest(d); n != "" {
			ap.approved = append(ap.approved, n)
		}
	}
	if src.SHA256Path != "" {
		b, err := ReadSidecar(src.SHA256Path, sha256What(src))
		if err != nil {
			return ap, err
		}
		if ap.expected, err = ParseSHA256Line(b, src.Name()); err != nil {
			return ap, err
		}
	}
	if src.SigPath != "" {
		b, err := ReadSignature(src.SigPath, sigWhat(src))
		if err != nil {
			return ap, err
		}
		ap.travels = b // for the peers, whose keys may approve it
		if len(p.TrustedKeys) > 0 {
			ap.sig, ap.keys = b, publicKeys(p.TrustedKeys)
		}
	}
	approvalOn := !p.Off && (p.Required || len(ap.approved) > 0 || len(p.TrustedKeys) > 0)
	switch {
	case p.ApprovedByPeer != "" && ap.expected == p.ApprovedByPeer:
		ap.mode = ApprovalPeer
	case ap.expected != "" && slices.Contains(ap.approved, ap.expected):
		ap.mode = ApprovalDigest
	case ap.sig != nil:
		ap.mode = ApprovalSignature
	case ap.expected == "" && len(ap.approved) > 0:
		// A raw device carries no .sha256: its digest must be approved.
		ap.mode, ap.atEnd = ApprovalDigest, true
	case ap.expected == "":
		return ap, fmt.Errorf("%w: there is no .sha256 file to check it against, and no approved_digests to compare with: put the .sha256 next to the tar, or approve the bundle's digest", ErrNotApproved)
	case !approvalOn:
		ap.mode = ApprovalOff
	case p.Unapproved:
		// Verified against its .sha256 and extracted, never loaded: it
		// waits for approval.
		ap.mode = ApprovalNone
	case len(p.TrustedKeys) > 0 && src.SigPath == "":
		return ap, fmt.Errorf("%w: digest %s is not in approved_digests and there is no .tar.minisig signature: ask the engineer to approve this bundle", ErrNotApproved, ap.expected)
	default:
		return ap, fmt.Errorf("%w: digest %s is not in approved_digests: ask the engineer to approve this bundle, or bring the approved one", ErrNotApproved, ap.expected)
	}
	return ap, nil
}

// approves tells whether digest is an approved one.
func (ap approval) approves(digest digest.Digest) bool { return slices.Contains(ap.approved, digest) }

// check runs the checks that need the digest.
func (ap approval) check(digest digest.Digest, hr *hashingReader) error {
	if ap.expected != "" && digest != ap.expected {
		return fmt.Errorf("%w (got %s, want %s from the .sha256 file): the stick or the file is damaged; copy it again", ErrMismatch, sha256digest.Short(digest), sha256digest.Short(ap.expected))
	}
	switch {
	case ap.atEnd:
		if !slices.Contains(ap.approved, digest) {
			return fmt.Errorf("%w: digest %s is not in approved_digests: ask the engineer to approve this bundle, or copy it again if it may be damaged", ErrNotApproved, digest)
		}
	case ap.mode == ApprovalSignature:
		if !hr.verifySig(ap.keys, ap.sig) {
			return fmt.Errorf("%w: the .tar.minisig signature does not verify with any trusted key: the bundle was altered or signed by an unknown key", ErrNotApproved)
		}
	}
	return nil
}

func checkSpace(dir string, sizeBytes, factor int64) error {
	if factor < 0 {
		return nil
	}
	if factor == 0 {
		factor = 2
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	need := satMul(factor, max(sizeBytes, 0))
	return diskspace.Check(dir, need, fmt.Sprintf("%d × the bundle's %s; free some space and plug the stick again", factor, HumanSize(sizeBytes)))
}
