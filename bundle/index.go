package bundle

import (
	"bytes"
	"compress/gzip"
	"encoding/gob"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/ferry-edge/ferry/internal/atomicfile"
)

// Index records how a bundle's tar maps onto its extracted tree: the raw
// header and padding blocks, verbatim, and which file holds each entry's
// content. With it a node serves the exact tar bytes (same digest) to its
// peers from the extracted tree, without keeping a second copy on disk.
type Index struct {
	Digest   string
	Size     int64
	Segments []Segment
}

// Segment is raw tar bytes followed by the content of one file.
type Segment struct {
	Raw  []byte
	Path string // relative to the extracted dir; "" when no content follows
	Size int64
}

func (ix *Index) add(raw []byte, path string, size int64) {
	if path == "" {
		size = 0
	}
	ix.Segments = append(ix.Segments, Segment{Raw: raw, Path: path, Size: size})
}

// WriteFile stores the index at path atomically.
func (ix *Index) WriteFile(path string) error {
	b, err := ix.Encode()
	if err == nil {
		err = atomicfile.WriteFile(path, b, 0o600)
	}
	if err != nil {
		return fmt.Errorf("writing tar index %s: %w", path, err)
	}
	return nil
}

// Encode is the index as WriteFile stores it. (Not MarshalBinary: gob
// would call it to encode the index itself.)
func (ix *Index) Encode() ([]byte, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	err := gob.NewEncoder(zw).Encode(ix)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	return b.Bytes(), err
}

// Decode reads an index Encode made.
func (ix *Index) Decode(b []byte) error {
	return ix.decode(bytes.NewReader(b))
}

func (ix *Index) decode(r io.Reader) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	return gob.NewDecoder(zr).Decode(ix)
}

// ReadIndex loads an index written by WriteFile.
func ReadIndex(path string) (*Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ix Index
	if err := ix.decode(f); err != nil {
		return nil, fmt.Errorf("tar index %s: %w", path, err)
	}
	return &ix, nil
}

// TarReader serves the tar's bytes from the extracted tree at root.
type TarReader struct {
	ix   *Index
	root string
	offs []int64 // start offset of each segment
}

// ReaderAt returns the tar bytes of the bundle extracted at root.
func (ix *Index) ReaderAt(root string) *TarReader {
	offs := make([]int64, len(ix.Segments))
	var off int64
	for i, s := range ix.Segments {
		offs[i] = off
		off += int64(len(s.Raw)) + s.Size
	}
	return &TarReader{ix: ix, root: root, offs: offs}
}

// Size is the tar's length.
func (t *TarReader) Size() int64 { return t.ix.Size }

// ReadAt implements io.ReaderAt.
func (t *TarReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("negative offset")
	}
	n := 0
	i := sort.Search(len(t.offs), func(i int) bool { return t.offs[i] > off }) - 1
	for ; n < len(p) && i >= 0 && i < len(t.ix.Segments); i++ {
		s := t.ix.Segments[i]
		pos := off + int64(n) - t.offs[i]
		if pos < int64(len(s.Raw)) {
			n += copy(p[n:], s.Raw[pos:])
			pos = int64(len(s.Raw))
		}
		if n == len(p) || s.Size == 0 {
			continue
		}
		fpos := pos - int64(len(s.Raw))
		want := min(int64(len(p)-n), s.Size-fpos)
		if want <= 0 {
			continue
		}
		m, err := readFileAt(filepath.Join(t.root, filepath.FromSlash(s.Path)), p[n:n+int(want)], fpos)
		n += m
		if err != nil {
			return n, err
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func readFileAt(path string, p []byte, off int64) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if err == io.EOF && n == len(p) {
		err = nil
	}
	if err == io.EOF {
		err = fmt.Errorf("%s is shorter than the bundle recorded: the extracted tree was altered", path)
	}
	return n, err
}
