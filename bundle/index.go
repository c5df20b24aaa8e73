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
	"unsafe"

	"github.com/ferry-edge/ferry/internal/atomicfile"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Index records how a bundle's tar maps onto its extracted tree: the raw
// header and padding blocks, byte for byte, and which file holds each
// entry's content. With it a node serves the exact tar bytes (same
// digest) to its peers from the extracted tree, without keeping a second
// copy on disk.
//
// It is compact: the raw blocks of every segment are kept in one buffer
// (Packed) with their runs of zeros squeezed (a header block is mostly
// zeros, padding all zeros), so that a bundle of many small entries
// costs a fraction of its tar in memory, not a multiple.
type Index struct {
	Digest   digest.Digest
	Size     int64
	Segments []Segment
	// Packed holds the raw bytes of the segments that have no Raw of
	// their own, packed (packZeros).
	Packed []byte

	held int64 // what add has put in: segments, paths, packed bytes
}

// Reading a bundle's tar holds, for every entry, its name (the tree's
// checks) and, in the Index that serves the tar again, a segment, its
// path and its header blocks packed. A release bundle holds tens of
// thousands of entries and an index of a few MiB; a crafted tar of
// millions of tiny entries, or of huge headers, is refused before it
// outgrows the unit's MemoryMax (1 GiB). Variables so that a test can
// lower them.
var (
	maxEntries          = 1 << 18 // 262144
	maxIndexBytes int64 = 64 << 20
)

// segmentCost is what a Segment costs besides its path and packed bytes.
const segmentCost = int64(unsafe.Sizeof(Segment{}))

func errTooManyEntries() error {
	return fmt.Errorf("%w: the bundle holds more than %d files: not a bundle ferry makes (a release holds tens of thousands); do not use it, and ask the engineer for one made with ferry bundle create",
		ErrInvalid, maxEntries)
}

func errIndexTooLarge() error {
	return fmt.Errorf("%w: the bundle's file names and tar headers take more than %s: not a bundle ferry makes (a release's take a few MiB); do not use it, and ask the engineer for one made with ferry bundle create",
		ErrInvalid, HumanSize(maxIndexBytes))
}

// entryBound counts a tar's entries and the bytes of their names as
// they are read, for every run, with an Index or not.
type entryBound struct {
	entries int
	names   int64
}

// count admits one more entry named name, or refuses the bundle.
func (b *entryBound) count(name string) error {
	b.entries++
	b.names += int64(len(name))
	if b.entries > maxEntries {
		return errTooManyEntries()
	}
	if b.names > maxIndexBytes {
		return errIndexTooLarge()
	}
	return nil
}

// Segment is raw tar bytes followed by the content of one file.
type Segment struct {
	// Raw is the raw bytes themselves in an index written before they
	// were packed; nil in a packed one.
	Raw []byte
	// Off and N locate the raw bytes, packed, in Index.Packed; RawLen is
	// their length unpacked.
	Off    int64
	N      int32
	RawLen int32
	Path   string // relative to the extracted dir; "" when no content follows
	Size   int64
}

// rawLen is the length of s's raw bytes.
func (s *Segment) rawLen() int64 {
	if s.Raw != nil {
		return int64(len(s.Raw))
	}
	return int64(s.RawLen)
}

// raw is s's raw bytes, unpacked when packed.
func (ix *Index) raw(s *Segment) []byte {
	if s.Raw != nil || s.RawLen == 0 {
		return s.Raw
	}
	return unpackZeros(ix.Packed[s.Off:s.Off+int64(s.N)], int(s.RawLen))
}

// add appends a segment, or refuses the bundle (ErrInvalid) when the
// index would outgrow maxEntries segments (and the metadata's and the
// end's) or maxIndexBytes: checked before anything is appended.
func (ix *Index) add(raw []byte, path string, size int64) error {
	if path == "" {
		size = 0
	}
	if len(ix.Segments) >= maxEntries+2 {
		return errTooManyEntries()
	}
	// packZeros writes at most one token byte per 128 bytes beyond them.
	n := int64(len(raw))
	if ix.held+segmentCost+int64(len(path))+n+n/128+1 > maxIndexBytes {
		return errIndexTooLarge()
	}
	off := int64(len(ix.Packed))
	ix.Packed = packZeros(ix.Packed, raw)
	ix.held += segmentCost + int64(len(path)) + int64(len(ix.Packed)) - off
	ix.Segments = append(ix.Segments, Segment{Off: off, N: int32(int64(len(ix.Packed)) - off), RawLen: int32(len(raw)), Path: path, Size: size})
	return nil
}

// Snapshot is the index as it is now, safe to read (encode) while the
// extraction goes on adding to ix: both only ever grow.
func (ix *Index) Snapshot() *Index {
	return &Index{Digest: ix.Digest, Size: ix.Size,
		Segments: ix.Segments[:len(ix.Segments):len(ix.Segments)], Packed: ix.Packed[:len(ix.Packed):len(ix.Packed)]}
}

// packZeros appends b to dst as tokens: a byte c < 128 is followed by
// c+1 literal bytes; a byte c >= 128 stands for c-127 zeros.
func packZeros(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		if b[i] == 0 {
			j := i
			for j < len(b) && b[j] == 0 && j-i < 128 {
				j++
			}
			dst = append(dst, byte(127+j-i))
			i = j
			continue
		}
		j := i
		for j < len(b) && j-i < 128 && (b[j] != 0 || j+1 < len(b) && b[j+1] != 0) {
			j++ // a lone zero stays in the literal
		}
		if j == i {
			j = i + 1
		}
		dst = append(dst, byte(j-i-1))
		dst = append(dst, b[i:j]...)
		i = j
	}
	return dst
}

// unpackZeros reverses packZeros into n bytes.
func unpackZeros(p []byte, n int) []byte {
	out := make([]byte, 0, n)
	for i := 0; i < len(p); {
		c := int(p[i])
		i++
		if c >= 128 {
			out = append(out, make([]byte, c-127)...)
			continue
		}
		end := min(i+c+1, len(p))
		out = append(out, p[i:end]...)
		i = end
	}
	return out
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
	for i := range ix.Segments {
		offs[i] = off
		off += ix.Segments[i].rawLen() + ix.Segments[i].Size
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
		s := &t.ix.Segments[i]
		pos := off + int64(n) - t.offs[i]
		rawLen := s.rawLen()
		if pos < rawLen {
			n += copy(p[n:], t.ix.raw(s)[pos:])
			pos = rawLen
		}
		if n == len(p) || s.Size == 0 {
			continue
		}
		fpos := pos - rawLen
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
