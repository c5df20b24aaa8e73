package localapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/safefile"
)

// ferry load hands the agent open files, not a path (SCM_RIGHTS over the
// status socket): the agent reads the bundle through them and never opens
// a path a caller names, so any file or device the caller can read works,
// whatever the unit's sandbox hides (ProtectHome, PrivateTmp).

// maxPassed bounds the descriptors one request carries: the tar, its
// .sha256 and its .minisig.
const maxPassed = 3

// PassedBundle is a bundle given as open files. It is a Medium: the agent
// closes it when it is done reading, or refuses it.
type PassedBundle struct {
	Label       string // the path the caller gave, for messages
	Tar         *os.File
	SHA256, Sig *os.File // nil when absent
}

// Bundles reads the files through this process's own descriptors, only
// ever ones passedBundle checked (checkPassed): /proc/self/fd/N is a
// magic link to the open file itself, so opening it resolves no path the
// caller made (no symbolic link of theirs is followed) and opens that very
// file, read-only (the bundle readers open with O_RDONLY, the sidecars'
// with O_NONBLOCK too and refuse anything but a regular file). The
// check makes that reopen grant nothing the caller did not have: each
// descriptor was open for reading, not O_PATH. Reopening rather than
// reading the passed descriptor gives the agent an open file of its own:
// the passed one shares its offset and flags with the caller, who could
// seek it or set O_NONBLOCK under the agent's reads.
func (p *PassedBundle) Bundles() []bundle.Source {
	src := bundle.Source{Path: fdPath(p.Tar), Label: p.Label}
	if fi, err := p.Tar.Stat(); err == nil && fi.Mode()&os.ModeDevice != 0 {
		src.Raw = true
	}
	if p.SHA256 != nil {
		src.SHA256Path = fdPath(p.SHA256)
	}
	if p.Sig != nil {
		src.SigPath = fdPath(p.Sig)
	}
	return []bundle.Source{src}
}

// Close closes every file.
func (p *PassedBundle) Close() error {
	for _, f := range []*os.File{p.Tar, p.SHA256, p.Sig} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}

// fdPath names an open file for this process: opening it opens the same
// file, whatever path it was found by.
func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// OpenBundle opens the bundle at path and its sidecars, as the caller:
// what ferry load passes to the agent. ferry load runs as root, perhaps in
// a directory another user can write: the sidecars are opened in the
// tar's directory with no symbolic link followed, and a .minisig must
// parse as a signature, since the agent keeps it and offers it to peers.
func OpenBundle(path string) (*PassedBundle, error) {
	src, err := bundle.FindSource(path, "")
	if err != nil {
		return nil, err
	}
	p := &PassedBundle{Label: path}
	if p.Tar, err = os.Open(src.Path); err != nil {
		return nil, fmt.Errorf("bundle %s: %w", src.Path, err)
	}
	if src.Raw {
		return p, nil // a device has no sidecars
	}
	if err := p.openSidecars(path); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// openSidecars opens the .sha256 and .tar.minisig beside the tar at path,
// if there are any.
func (p *PassedBundle) openSidecars(path string) error {
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("bundle %s: %w", path, err)
	}
	defer dir.Close()
	tar := filepath.Base(path)
	if p.SHA256, err = openSidecar(dir, strings.TrimSuffix(tar, ".tar")+".sha256", "the .sha256 file of "+tar); err != nil {
		return err
	}
	what := "the .minisig file of " + tar
	if p.Sig, err = openSidecar(dir, tar+".minisig", what); err != nil || p.Sig == nil {
		return err
	}
	b, err := safefile.ReadAll(p.Sig, what, bundle.MaxSidecar)
	if err != nil {
		return fmt.Errorf("%w: %s is over %d bytes: it is not what ferry writes there; copy the one that came with the bundle", bundle.ErrInvalid, what, bundle.MaxSidecar)
	}
	if err := bundle.CheckSignature(b, what); err != nil {
		return err
	}
	_, err = p.Sig.Seek(0, io.SeekStart)
	return err
}

// openSidecar opens name in dir, or returns nil when there is none; one
// that is a symbolic link, or no regular file, is refused.
func openSidecar(dir *os.File, name, what string) (*os.File, error) {
	f, err := safefile.OpenBeneath(dir, name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case errors.Is(err, safefile.ErrNotRegular):
		return nil, fmt.Errorf("%w: %s in %s is refused (%v): ferry load follows no link and reads no special file beside the bundle; copy the file itself there", bundle.ErrInvalid, what, dir.Name(), err)
	case err != nil:
		return nil, fmt.Errorf("bundle: %s: %w", what, err)
	}
	return f, nil
}

// files lists the open files and what each is, in the order they travel.
func (p *PassedBundle) files() ([]*os.File, []string) {
	fs, kinds := []*os.File{p.Tar}, []string{"tar"}
	if p.SHA256 != nil {
		fs, kinds = append(fs, p.SHA256), append(kinds, "sha256")
	}
	if p.Sig != nil {
		fs, kinds = append(fs, p.Sig), append(kinds, "minisig")
	}
	return fs, kinds
}

var (
	// ErrNotRoot: the process that connected is not root, and only root
	// may pass bundles to the agent.
	ErrNotRoot = errors.New("only root may pass bundles to the agent")
	// ErrPassedFile: a descriptor passed with a load request is not one
	// the agent reads (O_PATH, write-only, a FIFO, a socket…).
	ErrPassedFile = errors.New("refused a passed file")
)

// passedBundle takes the files a load request's connection carried, from
// root only (SO_PEERCRED), each checked by checkPassed. Any refusal
// closes every file.
func passedBundle(r *http.Request) (*PassedBundle, error) {
	c, _ := r.Context().Value(fdConnKey{}).(*fdConn)
	if c == nil {
		return nil, errors.New("no files came with the request: use 'ferry load PATH'")
	}
	files := c.take()
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	if err := c.fromRoot(); err != nil {
		closeAll()
		return nil, err
	}
	kinds := strings.Split(r.URL.Query().Get("files"), ",")
	if len(files) != len(kinds) || len(files) == 0 {
		closeAll()
		return nil, fmt.Errorf("the request names %d files and carries %d: use 'ferry load PATH'", len(kinds), len(files))
	}
	p := &PassedBundle{Label: r.URL.Query().Get("label")}
	for i, k := range kinds {
		var slot **os.File
		switch k {
		case "tar":
			slot = &p.Tar
		case "sha256":
			slot = &p.SHA256
		case "minisig":
			slot = &p.Sig
		default:
			closeAll()
			return nil, fmt.Errorf("%w: the request names a file %q, not a tar, sha256 or minisig: use 'ferry load PATH'", ErrPassedFile, k)
		}
		if *slot != nil {
			closeAll()
			return nil, fmt.Errorf("%w: the request passes two %s files: use 'ferry load PATH'", ErrPassedFile, k)
		}
		if err := checkPassed(files[i], k); err != nil {
			closeAll()
			return nil, err
		}
		*slot = files[i]
	}
	if p.Tar == nil {
		closeAll()
		return nil, errors.New("no tar among the files passed")
	}
	return p, nil
}

// checkPassed refuses (ErrPassedFile) a descriptor the agent must not
// read or reopen for the caller: one opened with O_PATH, which grants no
// read (reopening it through /proc/self/fd would give root's read to a
// caller that had none); one open for writing only, for the same reason;
// and anything that fstat says is not a regular file, or, for the tar, a
// block device holding a raw bundle (a FIFO, a socket, a directory, a
// character device such as /dev/zero).
func checkPassed(f *os.File, kind string) error {
	flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("%w: the %s: F_GETFL: %v", ErrPassedFile, kind, err)
	}
	if flags&unix.O_PATH != 0 {
		return fmt.Errorf("%w: the %s was passed as an O_PATH descriptor, which grants no read: pass a file opened for reading (ferry load PATH does)", ErrPassedFile, kind)
	}
	if flags&unix.O_ACCMODE == unix.O_WRONLY {
		return fmt.Errorf("%w: the %s was passed open for writing only: pass a file opened for reading (ferry load PATH does)", ErrPassedFile, kind)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("%w: the %s: fstat: %v", ErrPassedFile, kind, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFBLK:
		if kind == "tar" {
			return nil
		}
	}
	return fmt.Errorf("%w: the %s passed is %s: ferry reads a bundle from a regular file (or, the tar only, a block device), its .sha256 and .minisig from regular files",
		ErrPassedFile, kind, safefile.Kind(st.Mode))
}
