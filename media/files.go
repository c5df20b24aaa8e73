package media

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ferry-edge/ferry/internal/safefile"
)

// Safe opens of a mounted stick's files: each bundle and its sidecars,
// opened relative to the mount, following no link, regular files only.

// MaxSidecar bounds a .sha256 or .tar.minisig on a stick: each is a line
// or a few, and a minisig travels to every peer.
const MaxSidecar = 4 << 10

// Candidate is one bundle found on a medium.
//
// The files of a mounted stick are opened when the stick is, relative to
// the mount, refusing symbolic links and anything but regular files
// (Err); read them through Tar, SHA256 and Sig (or /proc/self/fd/N of
// them), never by opening the paths again.
type Candidate struct {
	// Name is the tar's base name ("upgrade-4.13.7-x86_64.tar"), or the
	// device's ("sdb") for a raw bundle.
	Name    string
	TarPath string // where the tar is (for messages), or the device node itself when Raw
	// SHA256Path and SigPath are "" when the stick has no such file (always
	// for a raw bundle); for messages, like TarPath.
	SHA256Path string // <base>.sha256
	SigPath    string // <base>.tar.minisig
	Raw        bool

	// Tar, SHA256 and Sig are the files, open until the Medium is closed;
	// nil for a raw bundle, for a sidecar the stick lacks, and when Err is
	// set.
	Tar, SHA256, Sig *os.File
	// Err, wrapping ErrUnsafeFile, says why this bundle cannot be read (a
	// symlink, a FIFO, an oversized sidecar…): refuse it with this
	// reason. It names the file and the fix, never the file's bytes.
	Err error
}

// findCandidates lists upgrade-*.tar at the root of dir (names matched
// without regard to case, for FAT sticks), each with its <base>.sha256
// and <base>.tar.minisig when present, and opens them (safefile.OpenBeneath):
// relative to dir, no symbolic links, regular files only, never blocking.
// The directory entry's type is not trusted (on ext4 or xfs it is a byte
// the stick's maker chose): a name that opens as anything but a regular
// file makes its candidate's Err. On error, the files already opened are
// in the returned candidates, for Medium.Close.
func findCandidates(dir string) ([]Candidate, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("listing the stick: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("listing the stick: %w", err)
	}
	byLower := map[string]string{} // lower-case name → name
	for _, n := range names {
		byLower[strings.ToLower(n)] = n
	}
	var out []Candidate
	for lower, name := range byLower {
		if !strings.HasPrefix(lower, "upgrade-") || !strings.HasSuffix(lower, ".tar") {
			continue
		}
		base := name[:len(name)-len(".tar")]
		c := Candidate{Name: name, TarPath: filepath.Join(dir, name)}
		if n, ok := byLower[strings.ToLower(base+".sha256")]; ok {
			c.SHA256Path = filepath.Join(dir, n)
		}
		if n, ok := byLower[strings.ToLower(name+".minisig")]; ok {
			c.SigPath = filepath.Join(dir, n)
		}
		c.open(d)
		out = append(out, c)
	}
	// Those that can be read first: a stick's stray link does not hide
	// its bundle.
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Err == nil) != (out[j].Err == nil) {
			return out[i].Err == nil
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// open opens c's files in the stick's root d; on the first refusal it
// closes them and sets Err.
func (c *Candidate) open(d *os.File) {
	var err error
	if c.Tar, err = openOnStick(d, c.TarPath, 0); err == nil && c.SHA256Path != "" {
		c.SHA256, err = openOnStick(d, c.SHA256Path, MaxSidecar)
	}
	if err == nil && c.SigPath != "" {
		c.Sig, err = openOnStick(d, c.SigPath, MaxSidecar)
	}
	if err != nil {
		for _, f := range []*os.File{c.Tar, c.SHA256, c.Sig} {
			if f != nil {
				f.Close()
			}
		}
		c.Tar, c.SHA256, c.Sig, c.Err = nil, nil, nil, err
	}
}

// openOnStick opens the file at path (in d) as safefile.OpenBeneath does,
// refusing it (ErrUnsafeFile) when it is not a regular file or, with
// max > 0, when it is over max bytes. The error names the file and the
// fix.
func openOnStick(d *os.File, path string, max int64) (*os.File, error) {
	name := filepath.Base(path)
	f, err := safefile.OpenBeneath(d, name)
	if err != nil {
		if errors.Is(err, safefile.ErrNotRegular) {
			return nil, fmt.Errorf("%w: %v: ferry reads only regular files on a stick; copy the file itself (not a link to it) onto the stick", ErrUnsafeFile, err)
		}
		return nil, fmt.Errorf("%w: %q cannot be opened: %v: copy it onto the stick again", ErrUnsafeFile, name, errors.Unwrap(err))
	}
	if max > 0 {
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%w: %q cannot be read: %v: copy it onto the stick again", ErrUnsafeFile, name, err)
		}
		if fi.Size() > max {
			f.Close()
			return nil, fmt.Errorf("%w: %q is over %d bytes: it is not a .sha256 or .minisig file; copy the right one onto the stick", ErrUnsafeFile, name, max)
		}
	}
	return f, nil
}
