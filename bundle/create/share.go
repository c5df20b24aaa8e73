package create

import (
	"path/filepath"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
)

// A run can be followed: other nodes that make the same bundle from this
// one (pull's registry mode) see what it resolved as soon as it is
// resolved, and each blob once it lies verified in the work tree, so
// that each byte crosses the site's link once and the other nodes copy
// it while it still arrives.

// Sharer is told what a run resolved and which blobs it holds.
type Sharer interface {
	// Resolved is called once, after every image and signature is
	// resolved and before any blob is fetched.
	Resolved(r *Resolution)
	// Arrived is called for each blob of Resolution.Blobs once it lies
	// verified at BlobPath (fetched, or kept from an earlier run).
	Arrived(d digest.Digest)
}

// Resolution is everything a run took from the registry besides blobs:
// a follower that asks for exactly this gets the same bundle.
type Resolution struct {
	WorkDir   string
	Release   digest.Digest // the release image's manifest (list)
	Manifests map[digest.Digest]Manifest
	// Tags are the tags resolved, by "<original name>:<tag>" (extra
	// images by tag, sigstore attachments).
	Tags map[string]digest.Digest
	// Extras are the digests the extra images given by tag resolved to,
	// by the extra as Options.ExtraImages names it: what the node that
	// pulls publishes for the others to pin (Options.Pins).
	Extras map[string]digest.Digest
	Blobs  map[digest.Digest]int64 // the sizes of the blobs to fetch
	// ReleaseSignatures are the release's, as the bundle carries them.
	ReleaseSignatures [][]byte
}

// Manifest is one manifest's bytes as the registry served them.
type Manifest struct {
	MediaType string
	Body      []byte
}

// BlobPath is where blob d lies in workDir once verified; nothing else
// of workDir (partial downloads included) is at such a path.
func BlobPath(workDir string, d digest.Digest) string {
	return filepath.Join(workDir, filepath.FromSlash(bundle.RegistryRoot), filepath.FromSlash(bundle.BlobDataPath(digest.Digest(d))))
}

// resolution gathers plans and signatures for a Sharer.
func resolution(workDir string, plans []*imagePlan, sigs [][]byte) *Resolution {
	r := &Resolution{WorkDir: workDir, Release: digest.Digest(plans[0].ref.digest), Manifests: map[digest.Digest]Manifest{}, Tags: map[string]digest.Digest{},
		Blobs: map[digest.Digest]int64{}, ReleaseSignatures: sigs}
	for _, p := range plans {
		for _, m := range p.manifests {
			r.Manifests[m.digest] = Manifest{MediaType: m.mediaType, Body: m.body}
		}
		for _, b := range p.blobs {
			r.Blobs[digest.Digest(b.Digest)] = b.Size
		}
		if p.ref.tag != "" && len(p.manifests) > 0 {
			r.Tags[p.ref.name+":"+p.ref.tag] = p.manifests[len(p.manifests)-1].digest
		}
	}
	return r
}
