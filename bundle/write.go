package bundle

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

// ErrTreeEntry marks a file in a registry tree that cannot go into a bundle
// (a symlink, device, FIFO or socket).
var ErrTreeEntry = errors.New("not a directory or regular file")

// tarTreeEntry is one directory or regular file of a registry tree.
type tarTreeEntry struct {
	name string // tar name: relative, dirs end in "/"
	path string // on disk
	size int64
	dir  bool
}

// WriteTar writes the bundle tar for the registry tree rooted at
// root/docker/registry/v2 to w: metadata.json first, then every directory
// and regular file below docker/registry/v2/ in sorted name order, with
// canonical headers (mtime meta.Created, or 0 when unset; uid and gid 0; no
// user or group names; mode 0755 for directories and 0644 for files). The
// archive ends right after its two zero end blocks. The same tree and
// metadata always give the same bytes.
//
// WriteTar fills meta.SizeBytes and meta.Size with the extracted size (every
// file including metadata.json) and meta.FormatVersion when unset (the
// oldest format that holds it), then
// validates meta. It refuses a tree holding anything but directories and
// regular files (ErrTreeEntry). It returns the tar's digest
// ("sha256:<hex>") and length.
func WriteTar(w io.Writer, meta *Metadata, root string) (d digest.Digest, size int64, err error) {
	entries, files, err := walkRegistryTree(root)
	if err != nil {
		return "", 0, err
	}
	if meta.FormatVersion == 0 {
		meta.FormatVersion = meta.OldestFormat()
	}
	mjson, err := sizeMetadata(meta, files)
	if err != nil {
		return "", 0, err
	}
	if err := ValidateMetadata(meta); err != nil {
		return "", 0, fmt.Errorf("bundle metadata: %w", err)
	}

	mtime := time.Unix(0, 0)
	if !meta.Created.IsZero() {
		mtime = meta.Created.Truncate(time.Second)
	}
	h := sha256.New()
	cw := &tarByteCounter{w: io.MultiWriter(w, h)}
	tw := tar.NewWriter(cw)
	hdr := func(name string, size int64, dir bool) *tar.Header {
		th := &tar.Header{Name: name, Size: size, Mode: 0o644, Typeflag: tar.TypeReg, ModTime: mtime}
		if dir {
			th.Mode, th.Typeflag = 0o755, tar.TypeDir
		}
		return th
	}
	if err := tw.WriteHeader(hdr(MetadataName, int64(len(mjson)), false)); err != nil {
		return "", 0, err
	}
	if _, err := tw.Write(mjson); err != nil {
		return "", 0, err
	}
	buf := make([]byte, 1<<20)
	for _, e := range entries {
		if err := tw.WriteHeader(hdr(e.name, e.size, e.dir)); err != nil {
			return "", 0, fmt.Errorf("bundle tar: %s: %w", e.path, err)
		}
		if e.dir {
			continue
		}
		if err := copyTreeFile(tw, e, buf); err != nil {
			return "", 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return "", 0, err
	}
	return digest.FromSHA256(h.Sum(nil)), cw.n, nil
}

// copyTreeFile copies exactly e.size bytes of e into tw, failing if the file
// changed since the walk.
func copyTreeFile(tw io.Writer, e tarTreeEntry, buf []byte) error {
	f, err := os.Open(e.path)
	if err != nil {
		return fmt.Errorf("bundle tar: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("bundle tar: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != e.size {
		return fmt.Errorf("bundle tar: %s changed while the bundle was written", e.path)
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(f, e.size), buf)
	if err != nil {
		return fmt.Errorf("bundle tar: %s: %w", e.path, err)
	}
	if n != e.size {
		return fmt.Errorf("bundle tar: %s shrank while the bundle was written", e.path)
	}
	return nil
}

// sizeMetadata sets meta's size fields to files plus the length of
// metadata.json itself and returns metadata.json. The length depends on the
// size written in it, so it iterates to a fixed point.
func sizeMetadata(meta *Metadata, files int64) ([]byte, error) {
	var b []byte
	for range 10 {
		var err error
		b, err = MarshalMetadata(meta)
		if err != nil {
			return nil, err
		}
		total := files + int64(len(b))
		if meta.SizeBytes == total && meta.Size == HumanSize(total) {
			return b, nil
		}
		meta.SizeBytes, meta.Size = total, HumanSize(total)
	}
	return nil, errors.New("bundle metadata: size did not settle")
}

// MarshalMetadata encodes metadata.json as bundles carry it: indented,
// ending in a newline.
func MarshalMetadata(meta *Metadata) ([]byte, error) {
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// walkRegistryTree lists every directory and regular file strictly below
// root/docker/registry/v2, sorted by tar name, and the sum of file sizes.
func walkRegistryTree(root string) ([]tarTreeEntry, int64, error) {
	top := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(RegistryRoot, "/")))
	fi, err := os.Lstat(top)
	if err != nil {
		return nil, 0, fmt.Errorf("bundle tar: registry tree: %w", err)
	}
	if !fi.IsDir() {
		return nil, 0, fmt.Errorf("bundle tar: %s: %w", top, ErrTreeEntry)
	}
	var entries []tarTreeEntry
	var total int64
	err = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == top {
			return nil
		}
		rel, err := filepath.Rel(top, p)
		if err != nil {
			return err
		}
		name := RegistryRoot + filepath.ToSlash(rel)
		switch t := d.Type(); {
		case t.IsDir():
			entries = append(entries, tarTreeEntry{name: name + "/", path: p, dir: true})
		case t.IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			entries = append(entries, tarTreeEntry{name: name, path: p, size: info.Size()})
			total += info.Size()
		default:
			return fmt.Errorf("bundle tar: %s is a %s: %w; only directories and regular files can go in a bundle", p, fileTypeName(t), ErrTreeEntry)
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	// Byte order of names: a directory ("a/") sorts before everything in it
	// ("a/x"), so parents always come first.
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, total, nil
}

func fileTypeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeDevice != 0:
		return "device"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

type tarByteCounter struct {
	w io.Writer
	n int64
}

func (c *tarByteCounter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
