package create

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/distribution/distribution/v3"
	_ "github.com/distribution/distribution/v3/manifest/manifestlist" // registers manifest list and OCI index media types
	_ "github.com/distribution/distribution/v3/manifest/ocischema"    // registers OCI manifest media types
	_ "github.com/distribution/distribution/v3/manifest/schema2"      // registers docker schema2 media types
	"github.com/distribution/distribution/v3/registry/storage"
	"github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/distribution/reference"
	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/singleflight"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
)

// treeStore writes images into a registry tree through distribution's own
// storage layer (no registry process, no HTTP), so the tree is exactly what
// distribution's filesystem driver writes and any distribution registry
// serves it as is.
type treeStore struct {
	root string // holds docker/registry/v2
	reg  distribution.Namespace

	flights  singleflight.Group
	mu       sync.Mutex
	good     map[godigest.Digest]bool // blob data present and checked this run
	linked   map[string]bool          // repo + "@" + digest
	keep     map[string]bool          // paths below docker/registry/v2 the bundle needs
	manifest sync.Mutex               // serializes manifest and tag writes

	fetched, reused atomic.Int64 // blobs downloaded, blobs found from an earlier run
	share           Sharer       // nil: none follows
}

func openTreeStore(ctx context.Context, root string, share Sharer) (*treeStore, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	drv := filesystem.New(filesystem.DriverParameters{RootDirectory: root, MaxThreads: 100})
	reg, err := storage.NewRegistry(ctx, drv)
	if err != nil {
		return nil, err
	}
	return &treeStore{root: root, reg: reg, good: map[godigest.Digest]bool{}, linked: map[string]bool{}, keep: map[string]bool{}, share: share}, nil
}

func (s *treeStore) repository(ctx context.Context, repo string) (distribution.Repository, error) {
	named, err := reference.WithName(repo)
	if err != nil {
		return nil, fmt.Errorf("repository path %q: %w", repo, err)
	}
	return s.reg.Repository(ctx, named)
}

func (s *treeStore) need(p string) {
	s.mu.Lock()
	s.keep[p] = true
	s.mu.Unlock()
}

// hasManifest reports whether repo holds manifest d (a previous run put it
// after everything it references).
func (s *treeStore) hasManifest(ctx context.Context, repo string, d godigest.Digest) (bool, error) {
	r, err := s.repository(ctx, repo)
	if err != nil {
		return false, err
	}
	ms, err := r.Manifests(ctx)
	if err != nil {
		return false, err
	}
	return ms.Exists(ctx, d)
}

// ensureBlob makes blob desc present in the tree and linked into repo,
// downloading it with open only when the tree does not hold it already.
// Concurrent calls for one digest download it once.
func (s *treeStore) ensureBlob(ctx context.Context, repo string, desc ocispec.Descriptor, open func(off int64) (io.ReadCloser, error)) error {
	s.need(bundle.BlobDataPath(digest.Digest(desc.Digest)))
	s.need(path.Join("repositories", repo, "_layers", desc.Digest.Algorithm().String(), desc.Digest.Encoded(), "link"))
	_, err, _ := s.flights.Do("data "+desc.Digest.String(), func() (any, error) {
		s.mu.Lock()
		good := s.good[desc.Digest]
		s.mu.Unlock()
		if good {
			return nil, nil
		}
		ok, err := s.checkData(desc)
		if err != nil {
			return nil, err
		}
		if ok {
			s.reused.Add(1)
		} else {
			if err := s.fetch(desc, open); err != nil {
				return nil, err
			}
			s.fetched.Add(1)
		}
		s.mu.Lock()
		s.good[desc.Digest] = true
		s.mu.Unlock()
		if s.share != nil {
			s.share.Arrived(digest.Digest(desc.Digest))
		}
		return nil, nil
	})
	if err != nil {
		return err
	}
	_, err, _ = s.flights.Do("link "+repo+"@"+desc.Digest.String(), func() (any, error) {
		return nil, s.link(ctx, repo, desc)
	})
	return err
}

// checkData reports whether the tree holds desc's bytes, hashing them. A
// file with the wrong bytes is removed.
func (s *treeStore) checkData(desc ocispec.Descriptor) (bool, error) {
	p := BlobPath(s.root, digest.Digest(desc.Digest))
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if desc.Digest.Algorithm() != godigest.SHA256 {
		return false, fmt.Errorf("blob %s: only sha256 digests are supported", desc.Digest)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return false, err
	}
	if n == desc.Size && hex.EncodeToString(h.Sum(nil)) == desc.Digest.Encoded() {
		return true, nil
	}
	// Damaged: drop it and its directory so it is fetched again.
	return false, os.RemoveAll(filepath.Dir(p))
}

// partialDir holds blobs being fetched, beside the registry tree (which
// the tar and prune never look outside of): a run that stops keeps what
// each blob had received, and the next resumes it where it stopped.
const partialDir = ".partial"

// fetch downloads desc into the tree: into its partial file first, from
// where an earlier run stopped (open(off) resumes with a Range request),
// hashed as it comes; renamed to its place in the tree only when its size
// and digest are right, and linked into repo by ensureBlob.
func (s *treeStore) fetch(desc ocispec.Descriptor, open func(off int64) (io.ReadCloser, error)) error {
	if desc.Digest.Algorithm() != godigest.SHA256 {
		return fmt.Errorf("blob %s: only sha256 digests are supported", desc.Digest)
	}
	dir := filepath.Join(s.root, partialDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	part := filepath.Join(dir, desc.Digest.Encoded())
	f, err := os.OpenFile(part, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	off, err := io.Copy(h, f) // what an earlier run received
	if err != nil {
		return err
	}
	if off > desc.Size {
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		h.Reset()
		off = 0
	}
	if off < desc.Size {
		rc, err := open(off)
		if err != nil {
			return err
		}
		// One byte more than the size: a registry that sends more is
		// caught by the size check, not silently cut.
		n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(rc, desc.Size-off+1))
		rc.Close()
		off += n
		if err != nil {
			return err
		}
	}
	if off != desc.Size || hex.EncodeToString(h.Sum(nil)) != desc.Digest.Encoded() {
		os.Remove(part)
		return fmt.Errorf("blob %s: the registry sent %d bytes that do not match its digest and size (%d): fetched again on the next try", desc.Digest, off, desc.Size)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	data := BlobPath(s.root, digest.Digest(desc.Digest))
	if err := os.MkdirAll(filepath.Dir(data), 0o755); err != nil {
		return err
	}
	return os.Rename(part, data)
}

// mountOption links a blob the store already holds into a repository
// without copying it (distribution's cross-repository mount).
type mountOption struct {
	from reference.Canonical
	stat *ocispec.Descriptor
}

func (m mountOption) Apply(v any) error {
	o, ok := v.(*distribution.CreateOptions)
	if !ok {
		return fmt.Errorf("unexpected options type %T", v)
	}
	o.Mount.ShouldMount, o.Mount.From, o.Mount.Stat = true, m.from, m.stat
	return nil
}

func (s *treeStore) link(ctx context.Context, repo string, desc ocispec.Descriptor) error {
	key := repo + "@" + desc.Digest.String()
	s.mu.Lock()
	done := s.linked[key]
	s.mu.Unlock()
	if done {
		return nil
	}
	r, err := s.repository(ctx, repo)
	if err != nil {
		return err
	}
	bs := r.Blobs(ctx)
	if _, err := bs.Stat(ctx, desc.Digest); err != nil {
		from, err := reference.WithDigest(r.Named(), desc.Digest)
		if err != nil {
			return err
		}
		stat := ocispec.Descriptor{Digest: desc.Digest, Size: desc.Size, MediaType: desc.MediaType}
		_, err = bs.Create(ctx, mountOption{from: from, stat: &stat})
		var mounted distribution.ErrBlobMounted
		if !errors.As(err, &mounted) {
			if err == nil {
				err = errors.New("mount did not link")
			}
			return fmt.Errorf("link blob %s into %s: %w", desc.Digest, repo, err)
		}
	}
	s.mu.Lock()
	s.linked[key] = true
	s.mu.Unlock()
	return nil
}

// putManifest stores a manifest (whose blobs or children are already in
// repo) and, when tag is not empty, tags it.
func (s *treeStore) putManifest(ctx context.Context, repo, mediaType string, payload []byte, tag string) (godigest.Digest, error) {
	s.manifest.Lock()
	defer s.manifest.Unlock()
	r, err := s.repository(ctx, repo)
	if err != nil {
		return "", err
	}
	m, desc, err := distribution.UnmarshalManifest(mediaType, payload)
	if err != nil {
		return "", fmt.Errorf("manifest of type %q: %w", mediaType, err)
	}
	ms, err := r.Manifests(ctx)
	if err != nil {
		return "", err
	}
	exists, err := ms.Exists(ctx, desc.Digest)
	if err != nil {
		return "", err
	}
	if !exists {
		if _, err := ms.Put(ctx, m); err != nil {
			return "", fmt.Errorf("store manifest %s in %s: %w", desc.Digest, repo, err)
		}
	}
	s.need(bundle.BlobDataPath(digest.Digest(desc.Digest)))
	s.need(path.Join("repositories", repo, "_manifests/revisions", desc.Digest.Algorithm().String(), desc.Digest.Encoded(), "link"))
	if tag != "" {
		if err := r.Tags(ctx).Tag(ctx, tag, ocispec.Descriptor{MediaType: mediaType, Digest: desc.Digest, Size: int64(len(payload))}); err != nil {
			return "", fmt.Errorf("tag %s:%s: %w", repo, tag, err)
		}
		s.need(path.Join("repositories", repo, "_manifests/tags", tag, "current/link"))
		s.need(path.Join("repositories", repo, "_manifests/tags", tag, "index", desc.Digest.Algorithm().String(), desc.Digest.Encoded(), "link"))
	}
	return desc.Digest, nil
}

// prune removes from the tree every file the bundle does not need (upload
// leftovers, images of an earlier run with other inputs) and then empty
// directories. It fails if a needed file is missing.
func (s *treeStore) prune() (removed int, err error) {
	top := filepath.Join(s.root, filepath.FromSlash(strings.TrimSuffix(bundle.RegistryRoot, "/")))
	var dirs []string
	found := map[string]bool{}
	err = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		rel, err := filepath.Rel(top, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if s.keep[rel] && d.Type().IsRegular() {
			found[rel] = true
			return nil
		}
		removed++
		return os.Remove(p)
	})
	if err != nil {
		return removed, err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(dirs))) // children first
	for _, d := range dirs {
		if d == top {
			continue
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, fs.ErrExist) {
			return removed, err
		}
	}
	for p := range s.keep {
		if !found[p] {
			return removed, fmt.Errorf("registry tree: %s is missing after the copy", p)
		}
	}
	return removed, nil
}
