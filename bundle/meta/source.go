package meta

import (
	"io"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Source is where a bundle is read from.
type Source struct {
	// Path is the tar file, or a block device holding the raw tar.
	Path string
	// Raw means Path is a device: the tar ends at its end-of-archive
	// marker and whatever follows on the device is ignored.
	Raw bool
	// SHA256Path and SigPath are the sidecar files; "" when absent.
	SHA256Path string
	SigPath    string
	// Label is where the bundle came from when Path does not say it: a
	// descriptor passed by ferry load is read at /proc/self/fd/N, and
	// Label is the path the caller gave.
	Label string
	// Refused, when set, is why this bundle cannot be read at all (a
	// file on a stick that is a symbolic link or a FIFO…): every reader
	// refuses it with this reason, and nothing is opened.
	Refused error
	// Reader, when set, gives the tar's bytes instead of opening Path
	// (a fetch streaming into the extraction: cut-through); Size is
	// their length. Path still names the bundle and its sidecars.
	Reader io.Reader
	Size   int64
}

// Name is the tar's base name, as the technician sees it.
func (s Source) Name() string { return base(s.Where()) }

// Where is the path the bundle is known by (Label, else Path).
func (s Source) Where() string {
	if s.Label != "" {
		return s.Label
	}
	return s.Path
}

// Admission is what Options.Admit found short of a refusal.
type Admission struct {
	// DigestOnly are images (references as in metadata.json) to pull and
	// pin by digest only: the node's policy admits the digest but not the
	// tag they keep (DropTags).
	DigestOnly []string
	// Warnings say so, one line per image, for the status.
	Warnings []string
}

// Result describes a verified bundle.
type Result struct {
	Metadata *Metadata
	Digest   digest.Digest // sha256:<hex> of the tar bytes up to the end marker
	TarSize  int64
	// Approval is how it was approved (ApprovalNone: not approved, see
	// Policy.Unapproved).
	Approval Approval
	// Signature is the bundle's .minisig, if it had one: it travels to
	// the peers, whose own trusted_keys may approve the bundle by it.
	Signature []byte
	// Admission is what Options.Admit narrowed, if anything.
	Admission Admission
}

// StagingDir is where Extract writes before the rename; a leftover one
// (after a crash) is never taken as good and is removed by the next run.
// dest is a clean path (filepath.Clean's).
func StagingDir(dest string) string {
	dir, name := "", base(dest)
	if i := strings.LastIndexByte(dest, '/'); i >= 0 {
		dir = dest[:i+1]
	}
	return dir + ".staging-" + name
}

// base is filepath.Base, which links more than this package may.
func base(p string) string {
	if p == "" {
		return "."
	}
	p = strings.TrimRight(p, "/")
	if p == "" {
		return "/"
	}
	return p[strings.LastIndexByte(p, '/')+1:]
}
