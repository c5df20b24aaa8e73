// Package imagetree writes small but complete images in the layout of
// distribution's filesystem storage (the tree below docker/registry/v2/),
// for tests of what reads bundles: every blob hashes to its path and every
// manifest's blobs and links are there, so a tree check passes until a test
// breaks something on purpose.
package imagetree

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Media types of the manifests written here.
const (
	MediaManifest = "application/vnd.docker.distribution.manifest.v2+json"
	MediaList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaConfig   = "application/vnd.docker.container.image.v1+json"
	mediaLayer    = "application/vnd.docker.image.rootfs.diff.tar.gzip"
)

// Tree maps paths below docker/registry/v2/ to their content.
type Tree map[string][]byte

// Digest is "sha256:<hex>" of b.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// BlobPath is where distribution stores the blob d ("sha256:<hex>").
func BlobPath(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	return "blobs/sha256/" + h[:2] + "/" + h + "/data"
}

// ManifestLink is the link that makes manifest d servable from repo.
func ManifestLink(repo, d string) string {
	return "repositories/" + repo + "/_manifests/revisions/sha256/" + strings.TrimPrefix(d, "sha256:") + "/link"
}

// LayerLink is the link that makes blob d servable from repo.
func LayerLink(repo, d string) string {
	return "repositories/" + repo + "/_layers/sha256/" + strings.TrimPrefix(d, "sha256:") + "/link"
}

// Layer is a deterministic layer of size bytes for name: the same name and
// size give the same digest, different names different ones.
func Layer(name string, size int) []byte {
	if size <= 0 {
		size = 24 << 10
	}
	seed := []byte(name + "\n")
	b := make([]byte, size)
	for i := range b {
		b[i] = seed[i%len(seed)]
	}
	return b
}

// Add stores an image of one layer under name (registry/repo[:tag]) and
// returns its reference name[:tag]@sha256:<manifest>.
func (t Tree) Add(name string, layer []byte) string {
	t.blob(layer)
	return t.AddOver(name, Digest(layer), int64(len(layer)))
}

// AddOver is Add for a layer already stored elsewhere (a big one, written
// to disk by the caller at BlobPath(layer)): it stores the image's config,
// manifest and links.
func (t Tree) AddOver(name, layer string, size int64) string {
	repo, tag := split(name)
	config := []byte(fmt.Sprintf(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[%q]}}`, layer))
	m, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaManifest,
		"config":        map[string]any{"mediaType": mediaConfig, "digest": Digest(config), "size": len(config)},
		"layers":        []any{map[string]any{"mediaType": mediaLayer, "digest": layer, "size": size}},
	})
	t.blob(config)
	t[LayerLink(repo, Digest(config))] = []byte(Digest(config))
	t[LayerLink(repo, layer)] = []byte(layer)
	return t.manifest(name, repo, tag, m)
}

// AddList stores a manifest list under name naming the images children
// (references returned by Add under the same repository).
func (t Tree) AddList(name string, children ...string) string {
	repo, tag := split(name)
	var ms []any
	for _, c := range children {
		_, d, _ := strings.Cut(c, "@")
		b := t[BlobPath(d)]
		ms = append(ms, map[string]any{"mediaType": MediaManifest, "digest": d, "size": len(b),
			"platform": map[string]string{"architecture": "amd64", "os": "linux"}})
	}
	m, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": MediaList, "manifests": ms})
	return t.manifest(name, repo, tag, m)
}

func (t Tree) manifest(name, repo, tag string, m []byte) string {
	d := Digest(m)
	t.blob(m)
	t[ManifestLink(repo, d)] = []byte(d)
	if tag != "" {
		t["repositories/"+repo+"/_manifests/tags/"+tag+"/current/link"] = []byte(d)
		t["repositories/"+repo+"/_manifests/tags/"+tag+"/index/sha256/"+strings.TrimPrefix(d, "sha256:")+"/link"] = []byte(d)
	}
	return name + "@" + d
}

func (t Tree) blob(b []byte) { t[BlobPath(Digest(b))] = b }

// Size is the sum of the tree's file sizes.
func (t Tree) Size() int64 {
	var n int64
	for _, b := range t {
		n += int64(len(b))
	}
	return n
}

// split returns name's repository path (its registry host removed, as a
// bundle stores it) and its tag.
func split(name string) (repo, tag string) {
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	if host, rest, ok := strings.Cut(name, "/"); ok && (strings.ContainsAny(host, ".:") || host == "localhost") {
		name = rest
	}
	return name, tag
}
