package bundle

import (
	"archive/tar"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/internal/atomicfile"
)

// hashBlobs is off only in the benchmark that measures what hashing every
// blob costs.
var hashBlobs = true

// treeWriter checks every entry after metadata.json and, when root is set,
// writes it there.
type treeWriter struct {
	meta  *Metadata
	root  string // staging dir; "" to verify only
	total int64  // bytes of regular files so far
	limit int64  // the most total may reach (writeBound); 0: none
	seen  map[string]bool
	dirs  map[string]bool // created directories
	buf   []byte
	// replayed: the entry being read is already in the tree (a resumed
	// extraction reads it back from there): checked, not written.
	replayed bool
	// resuming: files after the replayed ones may be left, part written,
	// by the interrupted run: they are written over.
	resuming bool
	// pace, when set, is called after each chunk written (Options.Pacer);
	// wait times the tree's own IO for it.
	pace func(n int) error
	wait *waitMeter
	// writeBehind: write files back as they are written (Options.Sync).
	writeBehind bool

	ix      *treeIndex   // what the tree holds, checked after the pass
	bh      *blobHasher  // hashes blobs on another core
	blobSum []byte       // the last blob's sha256
	keep    bytes.Buffer // a link's or a possible manifest's bytes, reused
}

// close stops what the writer runs beside the pass.
func (w *treeWriter) close() {
	if w.bh != nil {
		w.bh.close()
	}
}

// checkName returns the clean name of a tar entry, or why it is refused.
func checkName(name string, typ byte) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: entry %q %s: the bundle was altered or not made by ferry; do not use it", ErrInvalid, truncate(name, 200), why)
	}
	if name == "" {
		return "", bad("has an empty name")
	}
	if strings.HasPrefix(name, "/") {
		return "", bad("is an absolute path")
	}
	if strings.Contains(name, "\\") || strings.ContainsRune(name, 0) {
		return "", bad("has a backslash or NUL in its name")
	}
	clean := path.Clean(name)
	if clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(name, "/../") || strings.HasSuffix(name, "/..") {
		return "", bad("leaves the bundle (..)")
	}
	if clean != strings.TrimSuffix(name, "/") || clean == "." {
		return "", bad("is not a clean relative path")
	}
	if typ == tar.TypeDir && strings.HasPrefix(RegistryRoot, clean+"/") {
		return clean, nil // docker/, docker/registry/
	}
	if !strings.HasPrefix(clean, strings.TrimSuffix(RegistryRoot, "/")) ||
		(clean != strings.TrimSuffix(RegistryRoot, "/") && !strings.HasPrefix(clean, RegistryRoot)) {
		return "", bad("is outside " + RegistryRoot)
	}
	return clean, nil
}

func (w *treeWriter) entry(tr *tar.Reader, hdr *tar.Header) error {
	if w.seen == nil {
		w.seen = map[string]bool{MetadataName: true}
		w.dirs = map[string]bool{}
		w.ix = newTreeIndex()
		w.bh = newBlobHasher()
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink, tar.TypeLink:
		return fmt.Errorf("%w: entry %q is a link: bundles hold only files and directories; do not use this bundle", ErrInvalid, truncate(hdr.Name, 200))
	default:
		return fmt.Errorf("%w: entry %q has type %q (device, FIFO or sparse): bundles hold only files and directories; do not use this bundle", ErrInvalid, truncate(hdr.Name, 200), hdr.Typeflag)
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return fmt.Errorf("%w: entry %q is a sparse file: do not use this bundle", ErrInvalid, truncate(hdr.Name, 200))
		}
	}
	clean, err := checkName(hdr.Name, hdr.Typeflag)
	if err != nil {
		return err
	}
	if w.seen[clean] {
		return fmt.Errorf("%w: entry %q appears twice: do not use this bundle", ErrInvalid, clean)
	}
	w.seen[clean] = true
	w.ix.see(strings.TrimPrefix(clean, RegistryRoot), hdr.Typeflag == tar.TypeDir)
	if hdr.Typeflag == tar.TypeDir {
		if w.root != "" {
			return w.mkdir(clean)
		}
		return nil
	}
	if hdr.Size < 0 {
		return fmt.Errorf("%w: entry %q has a negative size", ErrInvalid, clean)
	}
	// Every byte written before the digest matches is bounded (limit:
	// the claimed size, the source's length), checked before the entry
	// is written, without overflow.
	if w.limit > 0 && hdr.Size > w.limit-w.total {
		return fmt.Errorf("%w: its files add up to more than the %d bytes that metadata's sizeBytes (or size) and the source's length allow: the bundle was altered; do not use it", ErrInvalid, w.limit)
	}
	w.total += hdr.Size
	if w.meta.Shape != ShapeSeed && w.total > w.meta.SizeBytes {
		return fmt.Errorf("%w: its files add up to more than metadata's sizeBytes (%d): the bundle was altered; do not use it", ErrInvalid, w.meta.SizeBytes)
	}
	if w.buf == nil {
		w.buf = make([]byte, chunkSize)
	}
	rel := strings.TrimPrefix(clean, RegistryRoot)
	blob := blobHex(rel)
	var f *os.File
	if w.root != "" && !w.replayed {
		if err := w.mkdir(path.Dir(clean)); err != nil {
			return err
		}
		flags := os.O_CREATE | os.O_EXCL | os.O_WRONLY
		if w.resuming {
			flags = os.O_CREATE | os.O_TRUNC | os.O_WRONLY
		}
		s := w.wait.start()
		f, err = os.OpenFile(filepath.Join(w.root, clean), flags, 0o644)
		w.wait.stop(s)
		if err != nil {
			return fmt.Errorf("extracting %s: %w", clean, err)
		}
	}
	var wb *writeBehind
	if f != nil && w.writeBehind {
		wb = newWriteBehind(f, w.wait)
	}
	w.keep.Reset()
	keep := (blob != "" && hdr.Size <= maxManifest) || (isLink(rel) && hdr.Size <= maxLink)
	hashing := blob != "" && hashBlobs
	var n int64
	for n < hdr.Size && err == nil {
		buf := w.buf
		if hashing {
			buf = w.bh.buffer()
		}
		var k int
		k, err = io.ReadFull(tr, buf[:min(int64(len(buf)), hdr.Size-n)])
		n += int64(k)
		if f != nil && k > 0 && err == nil {
			err = w.write(f, wb, buf[:k])
		}
		if keep {
			w.keep.Write(buf[:k])
		}
		if hashing {
			w.bh.add(buf[:k])
		}
	}
	if hashing {
		w.blobSum = w.bh.sum()
	}
	if f != nil {
		if wb != nil && err == nil {
			wb.close()
		}
		s := w.wait.start()
		cerr := f.Close()
		w.wait.stop(s)
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		if isNoSpace(err) {
			return fmt.Errorf("%w: %w while extracting %s: free some space and plug the stick again", ErrNoSpace, ErrDiskFilled, clean)
		}
		return readErr(err)
	}
	if n != hdr.Size {
		return readErr(io.ErrUnexpectedEOF)
	}
	return w.index(rel, blob)
}

// index records a file just read for the tree check: a blob must hash to
// its name.
func (w *treeWriter) index(rel, blob string) error {
	switch {
	case blob != "":
		if got := hex.EncodeToString(w.blobSum); hashBlobs && got != blob {
			// Said only if the whole tar's digest matches: a damaged copy
			// is "copy it again", not "make it again".
			if w.ix.lying == nil {
				w.ix.lying = fmt.Errorf("%w: blob sha256:%s does not hash to its name (its bytes are sha256:%s): the bundle was altered, or made from a damaged registry, although its sha256 matches; ask the engineer to make it again", ErrInvalid, blob, got)
			}
			return nil
		}
		w.ix.blobs[blob] = true
		if w.keep.Len() > 0 {
			return w.ix.keep(blob, w.keep.Bytes())
		}
	case isLink(rel) && w.keep.Len() > 0:
		w.ix.links[rel] = strings.TrimSpace(w.keep.String())
	}
	return nil
}

func (w *treeWriter) mkdir(dir string) error {
	if dir == "." || w.dirs[dir] {
		return nil
	}
	s := w.wait.start()
	err := os.MkdirAll(filepath.Join(w.root, dir), 0o755)
	w.wait.stop(s)
	if err != nil {
		return fmt.Errorf("extracting %s: %w", dir, err)
	}
	for d := dir; d != "." && !w.dirs[d]; d = path.Dir(d) {
		w.dirs[d] = true
	}
	return nil
}

func (w *treeWriter) writeFile(name string, b []byte) error {
	return os.WriteFile(filepath.Join(w.root, name), b, 0o644)
}

// publish makes the staging dir appear as dest, durable first when sync.
func (w *treeWriter) publish(dest string, sync bool) error {
	if sync {
		s := w.wait.start()
		err := syncFS(w.root)
		w.wait.stop(s)
		if err != nil {
			return err
		}
	}
	if err := os.Rename(w.root, dest); err != nil {
		return fmt.Errorf("publishing %s: %w", dest, err)
	}
	if sync {
		return atomicfile.SyncDir(filepath.Dir(dest))
	}
	return nil
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// write writes p to f. Written back as it goes (wb), it writes and paces
// a write-behind window at a time, so that while the governor holds back
// what reaches the disk at once is one window, not a whole chunk: a burst
// short enough for an fsync that lands behind it.
func (w *treeWriter) write(f *os.File, wb *writeBehind, p []byte) error {
	step := len(p)
	if wb != nil && w.pace != nil {
		step = int(writeBehindWindow)
	}
	for len(p) > 0 {
		n := min(step, len(p))
		s := w.wait.start()
		_, err := f.Write(p[:n])
		w.wait.stop(s)
		if err != nil {
			return err
		}
		if wb != nil {
			wb.wrote(n)
		}
		if w.pace != nil {
			if err := w.pace(n); err != nil {
				return err
			}
		}
		p = p[n:]
	}
	return nil
}

func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// writerOnly hides os.File's ReadFrom so io.CopyBuffer uses our buffer.
type writerOnly struct{ io.Writer }
