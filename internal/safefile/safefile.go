// Package safefile opens files that strangers made (the files on a stick)
// without following them anywhere: relative to a directory descriptor, no
// symbolic links, nothing but a regular file, and never blocking on a
// FIFO. What it reads is bounded, and its errors name the file, never
// its bytes.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

var (
	// ErrNotRegular: the name is a symbolic link, a FIFO, a directory, a
	// device or a socket; only regular files are read.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooBig: the file is over the size its reader allows.
	ErrTooBig = errors.New("file too big")
)

// openFlags never follow a final symbolic link, never wait for a FIFO's
// writer, and keep the descriptor from leaking into children.
const openFlags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOFOLLOW | unix.O_CLOEXEC

// openat2 is unix.Openat2; tests replace it to take the ENOSYS path.
var openat2 = unix.Openat2

// OpenBeneath opens name, one entry of the directory dir (no '/'), for
// reading: with openat2 it may not resolve through any symbolic link or
// /proc magic link nor leave dir; on kernels without openat2 (ENOSYS),
// openat with O_NOFOLLOW (name is a single component, so nothing else is
// resolved). The opened file must be a regular file after fstat, else it
// is closed and refused (ErrNotRegular). A FIFO does not block: it is
// opened non-blocking and refused. The descriptor stays non-blocking,
// which changes nothing for a regular file.
func OpenBeneath(dir *os.File, name string) (*os.File, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("%q: %w: not a name in the directory", name, ErrNotRegular)
	}
	how := &unix.OpenHow{
		Flags:   openFlags,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := retryEINTR(func() (int, error) { return openat2(int(dir.Fd()), name, how) })
	if errors.Is(err, unix.ENOSYS) {
		fd, err = retryEINTR(func() (int, error) { return unix.Openat(int(dir.Fd()), name, openFlags, 0) })
	}
	if err != nil {
		switch {
		case errors.Is(err, unix.ELOOP):
			return nil, fmt.Errorf("%q: %w: it is a symbolic link", name, ErrNotRegular)
		case errors.Is(err, unix.EXDEV):
			return nil, fmt.Errorf("%q: %w: it leads out of its directory", name, ErrNotRegular)
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	if err := regular(f, name); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func retryEINTR(open func() (int, error)) (int, error) {
	for {
		fd, err := open()
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// regular refuses (ErrNotRegular) f unless fstat says it is a regular file.
func regular(f *os.File, name string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: name, Err: err}
	}
	if what := Kind(st.Mode); what != "" {
		return fmt.Errorf("%q: %w: it is %s", name, ErrNotRegular, what)
	}
	return nil
}

// Kind says what a file of this mode is in words ("a FIFO"), or "" for a
// regular file.
func Kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return ""
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return "not a regular file"
}

// ReadAll reads f (from its current offset) whole, refusing (ErrTooBig)
// a file over max bytes: by its size first, and never reading more than
// max+1 bytes whatever fstat said.
func ReadAll(f *os.File, name string, max int64) ([]byte, error) {
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > max {
		return nil, fmt.Errorf("%q: %w: %d bytes, over the %d allowed", name, ErrTooBig, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading %q: %w", name, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%q: %w: over the %d bytes allowed", name, ErrTooBig, max)
	}
	return b, nil
}

// ReadFile reads the regular file at path, at most max bytes (ErrTooBig
// beyond): for a sidecar named by a path this process chose, such as
// /proc/self/fd/N for a file opened with OpenBeneath. It opens
// non-blocking and refuses anything but a regular file (ErrNotRegular),
// so a FIFO or a device such as /dev/zero is neither waited on nor read.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := regular(f, path); err != nil {
		return nil, err
	}
	return ReadAll(f, path, max)
}
