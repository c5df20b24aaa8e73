package meta

import (
	"errors"
	"syscall"

	"github.com/ferry-edge/ferry/internal/room"
)

// Refusals: a bundle is refused for one of these reasons. Each wraps into
// the returned error with a message that says what to do; errors.Is finds
// the reason.
var (
	// ErrInvalid marks a bundle that breaks the format; errors.Is finds
	// it in every refusal caused by the bundle's own content.
	ErrInvalid     = errors.New("invalid bundle")
	ErrMismatch    = errors.New("sha256 mismatch")
	ErrWrongArch   = errors.New("wrong architecture")
	ErrNotApproved = errors.New("not approved")
	ErrNoSpace     = room.ErrNoSpace
	// ErrPolicy: the node's container signature policy (policy.json, the
	// one CRI-O applies) refuses an image of the bundle.
	ErrPolicy = errors.New("refused by the node's signature policy")
	// ErrDiskFilled: a write failed for lack of space (ENOSPC, EDQUOT)
	// while a bundle's bytes were written; it wraps ErrNoSpace too. Unlike
	// a room check that fails before any byte is written, it is not
	// retried into the same disk.
	ErrDiskFilled = errors.New("the disk filled up")
)

// DiskFilled reports whether err is a write that ran out of space:
// ErrDiskFilled, or ENOSPC/EDQUOT from anywhere (a peer fetch's write).
func DiskFilled(err error) bool {
	return errors.Is(err, ErrDiskFilled) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// IsRefusal reports whether err refuses the bundle itself (as opposed to an
// I/O error such as a stick pulled mid-read, after which a retry may work).
func IsRefusal(err error) bool {
	for _, r := range []error{ErrInvalid, ErrMismatch, ErrWrongArch, ErrNotApproved, ErrNoSpace, ErrPolicy} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// Reason names the refusal in a word or two, for status lines.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrMismatch):
		return "sha256 mismatch"
	case errors.Is(err, ErrWrongArch):
		return "wrong architecture"
	case errors.Is(err, ErrNotApproved):
		return "not approved"
	case errors.Is(err, ErrNoSpace):
		return "not enough space"
	case errors.Is(err, ErrPolicy):
		return "signature policy"
	case errors.Is(err, ErrInvalid):
		return "invalid bundle"
	}
	return "error"
}
