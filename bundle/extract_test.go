package bundle

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/internal/imagetree"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testTree is a complete registry tree: the release and one image.
var testTree = imagetree.Tree{}

var (
	testRelease = testTree.Add("quay.io/openshift-release-dev/ocp-release", imagetree.Layer("release", 0))
	testImage   = testTree.Add("quay.io/openshift-release-dev/ocp-v4.0-art-dev", imagetree.Layer("image", 4000))
	// testLayer is the image's layer blob, below RegistryRoot.
	testLayer = imagetree.BlobPath(imagetree.Digest(imagetree.Layer("image", 4000)))
)

func testMetadata(size int64) *Metadata {
	return &Metadata{
		FormatVersion: 1, Version: "4.13.7", Arch: "x86_64", Size: HumanSize(size), SizeBytes: size,
		Release: testRelease,
		Images:  []string{testImage},
		Created: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	}
}

// entry is one tar entry a test writes.
type entry struct {
	hdr  tar.Header
	body []byte
}

func file(name, body string) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, []byte(body)}
}

func dir(name string) entry {
	return entry{tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}, nil}
}

func validEntries() []entry {
	return treeEntries(testTree)
}

// treeEntries are the tar entries of a tree, directories first.
func treeEntries(tree imagetree.Tree) []entry {
	es := []entry{dir("docker/"), dir("docker/registry/"), dir("docker/registry/v2/"), dir("docker/registry/v2/blobs/")}
	for _, n := range slices.Sorted(maps.Keys(tree)) {
		es = append(es, file(RegistryRoot+n, string(tree[n])))
	}
	return es
}

// writeBundle writes metadata (or meta as raw JSON when it is []byte) then
// entries; it returns the tar bytes.
func writeBundle(t testing.TB, meta any, entries []entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	var mb []byte
	switch m := meta.(type) {
	case []byte:
		mb = m
	case *Metadata:
		var err error
		if mb, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	}
	if meta != nil {
		must(t, tw.WriteHeader(&tar.Header{Name: MetadataName, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mb))}))
		_, err := tw.Write(mb)
		must(t, err)
	}
	for _, e := range entries {
		h := e.hdr
		must(t, tw.WriteHeader(&h))
		if len(e.body) > 0 {
			_, err := tw.Write(e.body)
			must(t, err)
		}
	}
	must(t, tw.Close())
	return b.Bytes()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// stage writes a bundle and its .sha256 (of want, default the tar's own
// digest) into a scratch dir and returns the Source.
func stage(t testing.TB, tarBytes []byte, sha string) Source {
	t.Helper()
	d := t.TempDir()
	p := filepath.Join(d, "upgrade-4.13.7-x86_64.tar")
	must(t, os.WriteFile(p, tarBytes, 0o644))
	if sha == "" {
		sha = sum(tarBytes)
	}
	if sha != "none" {
		must(t, os.WriteFile(filepath.Join(d, "upgrade-4.13.7-x86_64.sha256"),
			[]byte(strings.TrimPrefix(sha, "sha256:")+"  upgrade-4.13.7-x86_64.tar\n"), 0o644))
	}
	src, err := FindSource(p, "")
	must(t, err)
	return src
}

func TestExtract_ValidBundleAppearsWithSameDigest(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	src := stage(t, tb, "")
	dest := filepath.Join(t.TempDir(), "4.13.7-x86_64")
	var ix Index
	var lastDone, lastTotal int64
	res, err := Extract(t.Context(), src, dest, Options{Policy: Policy{Arch: "x86_64"}, Index: &ix, Sync: true,
		Progress: func(d, tot int64) { lastDone, lastTotal = d, tot }})
	must(t, err)
	if string(res.Digest) != sum(tb) || res.TarSize != int64(len(tb)) {
		t.Fatalf("digest %s size %d, want %s %d", res.Digest, res.TarSize, sum(tb), len(tb))
	}
	if lastDone != int64(len(tb)) || lastTotal != int64(len(tb)) {
		t.Errorf("progress ended at %d/%d, want %d/%d", lastDone, lastTotal, len(tb), len(tb))
	}
	got, err := os.ReadFile(filepath.Join(dest, RegistryRoot, testLayer))
	must(t, err)
	if !bytes.Equal(got, imagetree.Layer("image", 4000)) {
		t.Fatal("blob content differs")
	}
	if _, err := os.Stat(filepath.Join(dest, MetadataName)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(StagingDir(dest)); !os.IsNotExist(err) {
		t.Fatalf("staging dir left behind: %v", err)
	}
	// The index regenerates the exact tar bytes from the tree.
	ra := ix.ReaderAt(dest)
	regen := make([]byte, ra.Size())
	n, err := ra.ReadAt(regen, 0)
	must(t, err)
	if n != len(tb) || !bytes.Equal(regen, tb) {
		t.Fatalf("regenerated tar differs (%d of %d bytes)", n, len(tb))
	}
	part := make([]byte, 700)
	_, err = ra.ReadAt(part, 1000)
	must(t, err)
	if !bytes.Equal(part, tb[1000:1700]) {
		t.Fatal("ranged read differs")
	}
	p := filepath.Join(t.TempDir(), "ix")
	must(t, ix.WriteFile(p))
	ix2, err := ReadIndex(p)
	must(t, err)
	if ix2.Digest != res.Digest || len(ix2.Segments) != len(ix.Segments) {
		t.Fatal("index round trip lost data")
	}
}

// Tee gets exactly the tar's bytes, in order, in the extraction pass:
// the agent hashes the peers' piece list from them.
func TestExtract_TeeGetsTheTarBytesInTheSamePass(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	var tee bytes.Buffer
	_, err := Extract(t.Context(), stage(t, tb, ""), filepath.Join(t.TempDir(), "b"), Options{Policy: Policy{Arch: "x86_64"}, Tee: &tee})
	must(t, err)
	if !bytes.Equal(tee.Bytes(), tb) {
		t.Fatalf("tee got %d bytes that differ from the tar's %d", tee.Len(), len(tb))
	}
}

func TestExtract_Rejects(t *testing.T) {
	meta := testMetadata(1 << 20)
	valid := writeBundle(t, meta, validEntries())
	with := func(extra ...entry) []byte { return writeBundle(t, meta, append(validEntries(), extra...)) }
	flipped := bytes.Clone(valid)
	flipped[len(flipped)/2] ^= 1
	otherArch := testMetadata(1 << 20)
	otherArch.Arch = "aarch64"
	future := testMetadata(1 << 20)
	future.FormatVersion = FormatVersion + 1
	small := testMetadata(100)
	cases := []struct {
		name    string
		tar     []byte
		sha     string // "" = tar's own digest
		policy  Policy
		want    error
		message string
	}{
		{"path traversal", with(file("docker/registry/v2/../../../etc/passwd", "x")), "", Policy{}, ErrInvalid, "leaves the bundle"},
		{"dotdot only", with(file("../evil", "x")), "", Policy{}, ErrInvalid, "leaves the bundle"},
		{"absolute name", with(file("/etc/passwd", "x")), "", Policy{}, ErrInvalid, "absolute"},
		{"unclean name", with(file("docker/registry/v2/./a", "x")), "", Policy{}, ErrInvalid, "clean"},
		{"symlink", with(entry{tar.Header{Name: "docker/registry/v2/l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, nil}), "", Policy{}, ErrInvalid, "link"},
		{"hardlink", with(entry{tar.Header{Name: "docker/registry/v2/h", Typeflag: tar.TypeLink, Linkname: "docker/registry/v2/blobs"}, nil}), "", Policy{}, ErrInvalid, "link"},
		{"char device", with(entry{tar.Header{Name: "docker/registry/v2/c", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, nil}), "", Policy{}, ErrInvalid, "device"},
		{"fifo", with(entry{tar.Header{Name: "docker/registry/v2/f", Typeflag: tar.TypeFifo}, nil}), "", Policy{}, ErrInvalid, "FIFO"},
		{"gnu sparse", withRaw(t, meta, gnuHeader(rawHeader("docker/registry/v2/s", 'S', 0))), "", Policy{}, ErrInvalid, "sparse"},
		{"pax sparse", withRaw(t, meta, append(rawPAX(t, "GNU.sparse.major=1\nGNU.sparse.minor=0\nGNU.sparse.name=docker/registry/v2/s\nGNU.sparse.realsize=0\n"), rawHeader("docker/registry/v2/GNUSparseFile.0/s", '0', 0)...)), "", Policy{}, ErrInvalid, "invalid bundle"},
		{"outside registry root", with(file("etc/cron.d/x", "x")), "", Policy{}, ErrInvalid, "outside"},
		{"duplicate entry", with(file(RegistryRoot+testLayer, "again")), "", Policy{}, ErrInvalid, "twice"},
		{"metadata not first", writeBundle(t, nil, append([]entry{dir("docker/")}, file(MetadataName, "{}"))), "", Policy{}, ErrInvalid, "first entry"},
		{"metadata missing", writeBundle(t, nil, validEntries()), "", Policy{}, ErrInvalid, "first entry"},
		{"metadata malformed", writeBundle(t, []byte("{not json"), validEntries()), "", Policy{}, ErrInvalid, "not valid JSON"},
		{"metadata missing field", writeBundle(t, []byte(`{"formatVersion":1,"version":"4.13.7","arch":"x86_64"}`), validEntries()), "", Policy{}, ErrInvalid, "sizeBytes"},
		{"unknown formatVersion", writeBundle(t, future, validEntries()), "", Policy{}, ErrInvalid, "newer"},
		{"sizes exceed sizeBytes", writeBundle(t, small, validEntries()), "", Policy{SpaceFactor: -1}, ErrInvalid, "sizeBytes"},
		{"wrong arch", writeBundle(t, otherArch, validEntries()), "", Policy{Arch: "x86_64"}, ErrWrongArch, "aarch64"},
		{"truncated mid entry", valid[:len(valid)-3000], "", Policy{}, ErrInvalid, "truncated"},
		{"truncated end marker", valid[:len(valid)-512], "", Policy{}, ErrInvalid, "truncated"},
		{"no end marker", valid[:len(valid)-1024], "", Policy{}, ErrInvalid, "truncated"},
		{"one flipped byte", flipped, sum(valid), Policy{}, nil, ""}, // ErrMismatch or ErrInvalid: see below
		{"trailing bytes", append(bytes.Clone(valid), make([]byte, 512)...), "", Policy{}, ErrInvalid, "follow the end"},
		{"record padding", append(bytes.Clone(valid), make([]byte, 10240-len(valid)%10240)...), "", Policy{}, ErrInvalid, "follow the end"},
		{"sha256 mismatch", valid, testDigest, Policy{}, ErrMismatch, "copy it again"},
		{"unapproved digest", valid, "", Policy{ApprovedDigests: []string{testDigest}}, ErrNotApproved, "approve"},
		{"no sha256 file", valid, "none", Policy{}, ErrNotApproved, ".sha256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := stage(t, c.tar, c.sha)
			scratch := t.TempDir()
			dest := filepath.Join(scratch, "out")
			_, err := Extract(t.Context(), src, dest, Options{Policy: c.policy})
			if err == nil {
				t.Fatal("accepted")
			}
			if c.want == nil {
				if !IsRefusal(err) {
					t.Fatalf("not a refusal: %v", err)
				}
			} else if !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.message) {
				t.Errorf("message %q does not say %q", err, c.message)
			}
			if !strings.Contains(err.Error(), "upgrade-4.13.7-x86_64.tar") {
				t.Errorf("message %q does not name the bundle", err)
			}
			ents, _ := os.ReadDir(scratch)
			if len(ents) != 0 {
				t.Errorf("left %d entries in the scratch dir (first %s)", len(ents), ents[0].Name())
			}
			if _, err := Verify(t.Context(), src, Options{Policy: c.policy}); err == nil {
				t.Error("Verify accepted what Extract refused")
			}
		})
	}
}

func TestExtract_ApprovedDigestAndSignature(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	pub, priv, err := minisign.GenerateKey(nil)
	must(t, err)
	otherPub, _, err := minisign.GenerateKey(nil)
	must(t, err)

	src := stage(t, tb, "")
	res, err := Verify(t.Context(), src, Options{Policy: Policy{ApprovedDigests: []string{strings.TrimPrefix(sum(tb), "sha256:")}}})
	must(t, err)
	if res.Approval != "digest" {
		t.Errorf("approval %q, want digest", res.Approval)
	}

	mr := minisign.NewReader(bytes.NewReader(tb))
	_, err = io.Copy(io.Discard, mr)
	must(t, err)
	must(t, os.WriteFile(src.Path+".minisig", mr.Sign(priv), 0o644))
	src, _ = FindSource(src.Path, "")
	res, err = Verify(t.Context(), src, Options{Policy: Policy{TrustedKeys: []TrustedKey{TrustKey(otherPub), TrustKey(pub)}}})
	must(t, err)
	if res.Approval != "signature" {
		t.Errorf("approval %q, want signature", res.Approval)
	}
	_, err = Verify(t.Context(), src, Options{Policy: Policy{TrustedKeys: []TrustedKey{TrustKey(otherPub)}}})
	if !errors.Is(err, ErrNotApproved) || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("bad signature: got %v", err)
	}
}

func TestVerify_RawDeviceStopsAtEndMarker(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	dev := append(bytes.Clone(tb), bytes.Repeat([]byte{0xAB}, 3<<20)...) // what follows on a device
	p := filepath.Join(t.TempDir(), "disk")
	must(t, os.WriteFile(p, dev, 0o644))
	src := Source{Path: p, Raw: true}
	res, err := Verify(t.Context(), src, Options{Policy: Policy{ApprovedDigests: []string{sum(tb)}}})
	must(t, err)
	if string(res.Digest) != sum(tb) {
		t.Fatalf("raw digest %s, want %s", res.Digest, sum(tb))
	}
	if _, err := Verify(t.Context(), src, Options{}); !errors.Is(err, ErrNotApproved) {
		t.Fatalf("raw device with no approved digest: %v", err)
	}
	if _, err := Verify(t.Context(), src, Options{Policy: Policy{ApprovedDigests: []string{testDigest}}}); !errors.Is(err, ErrNotApproved) {
		t.Fatalf("raw device with another approved digest: %v", err)
	}
}

func TestExtract_CancelLeavesNothing(t *testing.T) {
	big := make([]entry, 0, 40)
	big = append(big, validEntries()...)
	for i := range 30 {
		big = append(big, file(fmt.Sprintf("docker/registry/v2/blobs/sha256/bb/%d/data", i), strings.Repeat("x", 256<<10)))
	}
	tb := writeBundle(t, testMetadata(64<<20), big)
	src := stage(t, tb, "")
	scratch := t.TempDir()
	dest := filepath.Join(scratch, "out")
	ctx, cancel := contextWithCancel(t)
	_, err := Extract(ctx, src, dest, Options{Progress: func(done, _ int64) {
		if done > 2<<20 {
			cancel()
		}
	}})
	if err == nil {
		t.Fatal("extract finished despite cancel")
	}
	if ents, _ := os.ReadDir(scratch); len(ents) != 0 {
		t.Fatalf("left %s behind", ents[0].Name())
	}
}

func TestReadMetadata_ReadsOnlyFirstEntry(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	r := &countingReader{r: bytes.NewReader(tb)}
	m, err := ReadMetadata(r)
	must(t, err)
	if m.Version != "4.13.7" {
		t.Fatal(m.Version)
	}
	if r.n > 4096 {
		t.Fatalf("read %d bytes for metadata", r.n)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// rawHeader builds a ustar header block by hand, for entry kinds that
// archive/tar refuses to write.
func rawHeader(name string, typ byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000644\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], "00000000000\x00")
	b[156] = typ
	copy(b[257:265], "ustar\x0000")
	copy(b[148:156], "        ")
	var chk int
	for _, c := range b {
		chk += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", chk))
	return b
}

// rawPAX is a PAX extended header entry holding records.
func rawPAX(t testing.TB, records string) []byte {
	var body []byte
	for _, line := range strings.Split(strings.TrimSuffix(records, "\n"), "\n") {
		n := len(line) + 2
		for len(fmt.Sprintf("%d %s\n", n, line)) != n {
			n++
		}
		body = append(body, fmt.Sprintf("%d %s\n", n, line)...)
	}
	h := rawHeader("PaxHeaders/x", 'x', int64(len(body)))
	pad := make([]byte, (512-len(body)%512)%512)
	return append(append(h, body...), pad...)
}

// withRaw is a valid bundle with raw header bytes spliced in before the end.
func withRaw(t testing.TB, meta *Metadata, raw []byte) []byte {
	tb := writeBundle(t, meta, validEntries())
	end := len(tb) - 1024
	return append(append(bytes.Clone(tb[:end]), raw...), make([]byte, 1024)...)
}

// gnuHeader turns a rawHeader block into the old GNU format.
func gnuHeader(b []byte) []byte {
	copy(b[257:265], "ustar  \x00")
	copy(b[148:156], "        ")
	var chk int
	for _, c := range b {
		chk += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", chk))
	return b
}

// A fetch streams the tar into the extraction (cut-through): the bytes
// come from Source.Reader, the sidecars from beside Path, and a stream
// that is not the bundle the .sha256 names is refused.
func TestExtract_FromAReaderChecksTheSidecarDigest(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	src := stage(t, tb, "")
	must(t, os.Remove(src.Path)) // never opened
	src.Reader, src.Size = bytes.NewReader(tb), int64(len(tb))
	res, err := Extract(t.Context(), src, filepath.Join(t.TempDir(), "b"), Options{Policy: Policy{Arch: "x86_64"}})
	must(t, err)
	if string(res.Digest) != sum(tb) || res.TarSize != int64(len(tb)) {
		t.Fatalf("digest %s size %d, want %s %d", res.Digest, res.TarSize, sum(tb), len(tb))
	}
	bad := bytes.Clone(tb)
	bad[len(bad)-1030] ^= 1
	src.Reader = bytes.NewReader(bad)
	dest := filepath.Join(t.TempDir(), "c")
	if _, err := Extract(t.Context(), src, dest, Options{Policy: Policy{Arch: "x86_64"}}); !IsRefusal(err) {
		t.Fatalf("altered stream: %v, want it refused", err)
	}
	if _, err := os.Stat(dest); !os.IsNotExist(err) {
		t.Fatalf("a refused stream left %s: %v", dest, err)
	}
}

// failAfter reads from r until n bytes, then fails as a stopped fetch.
type failAfter struct {
	r io.Reader
	n int64
}

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("the fetch stopped")
	}
	p = p[:min(int64(len(p)), f.n)]
	n, err := f.r.Read(p)
	f.n -= int64(n)
	return n, err
}

// An extraction fed by a fetch that stopped resumes from its last
// checkpoint: the bytes before it are read back from the staging tree
// (and checked with the rest), those after come from the source.
func TestExtract_ResumesFromACheckpointInItsStagingTree(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<20), validEntries())
	src := stage(t, tb, "")
	dest := filepath.Join(t.TempDir(), "b")
	type cp struct {
		ix  Index
		off int64
	}
	var cps []cp
	var ix Index
	opts := Options{Policy: Policy{Arch: "x86_64"}, Index: &ix}
	opts.Checkpoint = func(off int64) {
		c := cp{off: off}
		c.ix = *ix.Snapshot()
		cps = append(cps, c)
	}
	src.Reader, src.Size = &failAfter{r: bytes.NewReader(tb), n: int64(len(tb)) - 1500}, int64(len(tb))
	if _, err := Extract(t.Context(), src, dest, opts); err == nil || IsRefusal(err) {
		t.Fatalf("stopped stream: %v, want a read error", err)
	}
	if len(cps) < 2 {
		t.Fatalf("%d checkpoints, want some", len(cps))
	}
	if _, err := os.Stat(StagingDir(dest)); err != nil {
		t.Fatalf("the staging dir of a stopped extraction with checkpoints is gone: %v", err)
	}
	last := cps[len(cps)-1]
	if regen := make([]byte, last.off); true {
		n, err := last.ix.ReaderAt(StagingDir(dest)).ReadAt(regen, 0)
		if err != nil || !bytes.Equal(regen[:n], tb[:last.off]) {
			t.Fatalf("the staging tree does not give back the tar up to the checkpoint (%d bytes, %v)", n, err)
		}
	}
	opts.Checkpoint = func(int64) {}
	opts.Resume = &Resume{Index: &last.ix, Offset: last.off}
	src.Reader = bytes.NewReader(tb[last.off:])
	res, err := Extract(t.Context(), src, dest, opts)
	must(t, err)
	if string(res.Digest) != sum(tb) {
		t.Fatalf("resumed digest %s, want %s", res.Digest, sum(tb))
	}
	got, err := os.ReadFile(filepath.Join(dest, RegistryRoot, testLayer))
	must(t, err)
	if !bytes.Equal(got, imagetree.Layer("image", 4000)) {
		t.Fatal("blob content differs after the resume")
	}
}
