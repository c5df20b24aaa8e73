package bundle

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// The tree holds what the metadata says (docs/design.md, "The tree check"):
// during the pass every blob is hashed against the digest in its path, and
// the link files and manifests are kept; after it, every image the metadata
// lists is walked down to its last blob, and the tree may hold no repository
// or tag the metadata does not list. A bundle that fails is refused where it
// is read, naming the item, instead of failing its pulls on every node.

const (
	blobsDir = "blobs/sha256/"
	// maxManifest bounds a blob kept in memory as a possible manifest
	// (distribution refuses manifests over 4 MiB).
	maxManifest = 4 << 20
	// maxKept bounds all manifests kept (a release: a few hundred KiB).
	maxKept = 32 << 20
	// maxLink bounds a link file ("sha256:<hex>" and a newline at most).
	maxLink = 128
)

// treeIndex is what the pass learned of the registry tree.
type treeIndex struct {
	blobs     map[string]bool   // hex of every blob present (each hashed)
	links     map[string]string // repository link paths → the digest they hold
	manifests map[string][]byte // hex → bytes of blobs that may be manifests
	kept      int64
	lying     error // the first blob that does not hash to its name
	// repos and tags are those the tree holds (each with its first
	// entry); dirs are directories below repositories/ outside any
	// repository's data: namespaces, or repositories with nothing in them.
	repos map[string]string // repository path → entry
	tags  map[string]string // "<repository path>:<tag>" → entry
	dirs  map[string]string // path below repositories/ → entry
}

func newTreeIndex() *treeIndex {
	return &treeIndex{blobs: map[string]bool{}, links: map[string]string{}, manifests: map[string][]byte{},
		repos: map[string]string{}, tags: map[string]string{}, dirs: map[string]string{}}
}

// see records the repository, and the tag, an entry below repositories/
// belongs to. A repository's path ends before its first component that
// starts with "_" (_manifests, _layers, _uploads), which no repository
// name may hold; a file outside those belongs to its directory.
func (ix *treeIndex) see(rel string, dir bool) {
	rest, ok := strings.CutPrefix(rel, "repositories/")
	if !ok {
		return
	}
	parts := strings.Split(rest, "/")
	i := slices.IndexFunc(parts, func(p string) bool { return strings.HasPrefix(p, "_") })
	switch {
	case i < 0 && dir:
		ix.dirs[rest] = cmp.Or(ix.dirs[rest], rel)
		return
	case i < 0:
		i = len(parts) - 1
	}
	repo := strings.Join(parts[:i], "/")
	ix.repos[repo] = cmp.Or(ix.repos[repo], rel)
	if len(parts) > i+2 && parts[i] == "_manifests" && parts[i+1] == "tags" {
		tag := repo + ":" + parts[i+2]
		ix.tags[tag] = cmp.Or(ix.tags[tag], rel)
	}
}

// blobHex is the hex digest a blob's path names, or "" for other files.
func blobHex(rel string) string {
	rest, ok := strings.CutPrefix(rel, blobsDir)
	if !ok {
		return ""
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[2] != "data" || len(parts[1]) != 64 || parts[0] != parts[1][:2] {
		return ""
	}
	if _, err := hex.DecodeString(parts[1]); err != nil {
		return ""
	}
	return parts[1]
}

func isLink(rel string) bool {
	return strings.HasPrefix(rel, "repositories/") && strings.HasSuffix(rel, "/link")
}

// mayBeManifest tells whether a blob's bytes are worth keeping: a
// manifest to walk, or a sigstore signature's payload (a few hundred
// bytes of JSON naming the manifest it signs) for the policy check.
func mayBeManifest(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' &&
		(bytes.Contains(b, []byte(`"schemaVersion"`)) || bytes.Contains(b, []byte(`"docker-manifest-digest"`)))
}

// keep records a blob that may be a manifest.
func (ix *treeIndex) keep(hexd string, b []byte) error {
	if !mayBeManifest(b) {
		return nil
	}
	ix.kept += int64(len(b))
	if ix.kept > maxKept {
		return fmt.Errorf("%w: it holds over %s of manifests: not a bundle ferry can check; ask the engineer to make it again with ferry bundle create", ErrInvalid, HumanSize(maxKept))
	}
	ix.manifests[hexd] = bytes.Clone(b)
	return nil
}

// manifest is the part of an image manifest, index or list the walk needs.
type manifest struct {
	MediaType string       `json:"mediaType"`
	Manifests []descriptor `json:"manifests"`
	Config    *descriptor  `json:"config"`
	Layers    []descriptor `json:"layers"`
	FSLayers  []struct {
		BlobSum string `json:"blobSum"`
	} `json:"fsLayers"` // schema 1
}

type descriptor struct {
	MediaType string   `json:"mediaType"`
	Digest    string   `json:"digest"`
	Size      int64    `json:"size"`
	URLs      []string `json:"urls"`
	Platform  *struct {
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

// foreign layers are not in any bundle: their URLs serve them.
func (d descriptor) foreign() bool {
	return len(d.URLs) > 0 || strings.Contains(d.MediaType, "foreign")
}

// check walks every image of meta through the tree.
func (ix *treeIndex) check(meta *Metadata) error {
	if ix.lying != nil {
		return ix.lying
	}
	all := meta.AllImages()
	repos := RepoPaths(all)
	for i, ref := range append(all, meta.Signatures...) {
		name, tag, digest := SplitRef(ref)
		w := treeWalk{ix: ix, ref: ref, repo: "repositories/" + repos[name] + "/"}
		if err := w.image(tag, digest); err != nil {
			what := "image"
			switch {
			case ref == meta.Release:
				what = "release image"
			case i >= len(all):
				what = "signature"
			}
			return fmt.Errorf("%w: the %s %s: %v: the bundle is incomplete or altered although its sha256 matches; ask the engineer to make it again", ErrInvalid, what, ref, err)
		}
	}
	return ix.unlisted(meta, repos)
}

// unlisted refuses a tree that holds a repository or tag the metadata
// does not list: what a node serves and mirrors is what was listed, and a
// bundle ferry makes holds nothing else. One exception: a tag that names a
// manifest the metadata lists in the same repository adds nothing (the
// embedded registry does not serve it either): upgrade-tool's recipe
// tags every image it copies :latest.
func (ix *treeIndex) unlisted(meta *Metadata, repos map[string]string) error {
	paths, tags, digests := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, ref := range append(meta.AllImages(), meta.Signatures...) {
		name, tag, digest := SplitRef(ref)
		paths[repos[name]] = true
		if tag != "" {
			tags[repos[name]+":"+tag] = true
		}
		if digest != "" {
			digests[repos[name]+"@"+digest] = true
		}
	}
	harmless := func(repoTag string) bool {
		i := strings.LastIndex(repoTag, ":")
		repo, tag := repoTag[:i], repoTag[i+1:]
		d, ok := ix.links["repositories/"+repo+"/_manifests/tags/"+tag+"/current/link"]
		return ok && digests[repo+"@"+d]
	}
	namespace := func(dir string) bool {
		for p := range paths {
			if p == dir || strings.HasPrefix(p, dir+"/") {
				return true
			}
		}
		return false
	}
	refuse := func(what, entry string) error {
		return fmt.Errorf("%w: it holds %s (%s%s), which its metadata.json does not list: the bundle was altered, or made by a tool that adds images; do not use it, ask the engineer to make it again with ferry bundle create", ErrInvalid, what, RegistryRoot, entry)
	}
	for _, repo := range slices.Sorted(maps.Keys(ix.repos)) {
		if !paths[repo] {
			return refuse("the repository "+repo, ix.repos[repo])
		}
	}
	for _, tag := range slices.Sorted(maps.Keys(ix.tags)) {
		if !tags[tag] && !harmless(tag) {
			return refuse("the tag "+tag, ix.tags[tag])
		}
	}
	for _, dir := range slices.Sorted(maps.Keys(ix.dirs)) {
		if !namespace(dir) {
			return refuse("the repository "+dir, ix.dirs[dir])
		}
	}
	return nil
}

// treeWalk checks one image of the metadata in its repository.
type treeWalk struct {
	ix   *treeIndex
	ref  string
	repo string // "repositories/<path>/"
}

func (w treeWalk) image(tag, digest string) error {
	if tag != "" {
		link := w.repo + "_manifests/tags/" + tag + "/current/link"
		got, ok := w.ix.links[link]
		switch {
		case !ok:
			return fmt.Errorf("its tag %s is not in the bundle (%s%s missing)", tag, RegistryRoot, link)
		case digest == "":
			digest = got
		case got != digest:
			return fmt.Errorf("its tag %s names %s, not the listed %s", tag, sha256digest.Short(got), digest)
		}
	}
	if digest == "" {
		return fmt.Errorf("it names no digest and no tag")
	}
	return w.manifest(digest, 0)
}

func (w treeWalk) manifest(digest string, depth int) error {
	hexd, ok := strings.CutPrefix(digest, "sha256:")
	if !ok {
		return fmt.Errorf("manifest %s is not a sha256 digest", digest)
	}
	if _, ok := w.ix.links[w.repo+"_manifests/revisions/sha256/"+hexd+"/link"]; !ok || !w.ix.blobs[hexd] {
		return fmt.Errorf("manifest %s is not in the bundle", digest)
	}
	b, ok := w.ix.manifests[hexd]
	if !ok {
		return fmt.Errorf("manifest %s is not a manifest", digest)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("manifest %s does not parse: %v", digest, err)
	}
	if len(m.Manifests) > 0 {
		if depth > 0 {
			return fmt.Errorf("manifest %s is a list inside a list", digest)
		}
		for _, c := range m.Manifests {
			if err := w.manifest(c.Digest, depth+1); err != nil {
				return fmt.Errorf("in its list: %w", err)
			}
		}
		return nil
	}
	blobs := m.Layers
	if m.Config != nil {
		blobs = append([]descriptor{*m.Config}, blobs...)
	}
	for _, l := range m.FSLayers {
		blobs = append(blobs, descriptor{Digest: l.BlobSum})
	}
	if len(blobs) == 0 {
		return fmt.Errorf("manifest %s names no blob", digest)
	}
	for _, d := range blobs {
		if err := w.blob(d); err != nil {
			return err
		}
	}
	return nil
}

func (w treeWalk) blob(d descriptor) error {
	hexd, _ := strings.CutPrefix(d.Digest, "sha256:")
	if d.foreign() && !w.ix.blobs[hexd] {
		return nil
	}
	if !w.ix.blobs[hexd] {
		return fmt.Errorf("blob %s is not in the bundle", d.Digest)
	}
	if _, ok := w.ix.links[w.repo+"_layers/sha256/"+hexd+"/link"]; !ok {
		return fmt.Errorf("blob %s is in the bundle but not linked to its repository", d.Digest)
	}
	return nil
}
