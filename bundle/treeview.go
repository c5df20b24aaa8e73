package bundle

import (
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Tree is what a pass kept of a bundle's registry tree once its digest and
// its images have checked (Options.Admit): tags, manifests and small JSON
// blobs (signature payloads), each hashed against its name. Names are the
// images' original names (quay.io/org/repo), as metadata.json lists them.
type Tree struct {
	ix    *treeIndex
	repos map[string]string // original name → path under repositories/
}

// Tag is the digest name:tag points at, if the bundle has that tag.
func (t Tree) Tag(name, tag string) (digest.Digest, bool) {
	repo, ok := t.repos[name]
	if !ok {
		return "", false
	}
	d, ok := t.ix.links["repositories/"+repo+"/_manifests/tags/"+tag+"/current/link"]
	return digest.Digest(d), ok
}

// Manifest is the manifest digest of repository name, if the bundle holds
// it there.
func (t Tree) Manifest(name string, d digest.Digest) ([]byte, bool) {
	repo, ok := t.repos[name]
	hexd, isSHA := strings.CutPrefix(string(d), "sha256:")
	if !ok || !isSHA {
		return nil, false
	}
	if _, linked := t.ix.links["repositories/"+repo+"/_manifests/revisions/sha256/"+hexd+"/link"]; !linked {
		return nil, false
	}
	b, ok := t.ix.manifests[hexd]
	return b, ok
}

// Blob is a small JSON blob of repository name that the pass kept (a
// signature's payload), if the bundle links it there.
func (t Tree) Blob(name string, d digest.Digest) ([]byte, bool) {
	repo, ok := t.repos[name]
	hexd, isSHA := strings.CutPrefix(string(d), "sha256:")
	if !ok || !isSHA {
		return nil, false
	}
	if _, linked := t.ix.links["repositories/"+repo+"/_layers/sha256/"+hexd+"/link"]; !linked {
		return nil, false
	}
	b, ok := t.ix.manifests[hexd]
	return b, ok
}
