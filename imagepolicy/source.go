package imagepolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	godigest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.podman.io/image/v5/directory"
	"go.podman.io/image/v5/docker/policyconfiguration"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/image"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/types"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
)

// sigstoreMIMEType is a cosign signature layer's media type; its
// annotations carry the signature over the layer's payload.
const sigstoreMIMEType = "application/vnd.dev.cosign.simplesigning.v1+json"

// errNotInBundle: the policy code reads manifests and signatures only,
// through the staged copy.
var errNotInBundle = errors.New("not read by the policy check")

// bundleRef is an image of the bundle under its original name, as a
// containers/image reference of transport "docker": the policy applies the
// docker transport's scopes to it, as CRI-O does to the same pull made
// through ferry's mirror.
type bundleRef struct {
	named reference.Named // name@digest or name:tag
	tree  bundle.Tree
	arch  string // the node's GOARCH: the instance of a list CRI-O pulls
}

func (r bundleRef) Transport() types.ImageTransport  { return dockerLike{} }
func (r bundleRef) StringWithinTransport() string    { return "//" + r.named.String() }
func (r bundleRef) DockerReference() reference.Named { return r.named }

func (r bundleRef) PolicyConfigurationIdentity() string {
	id, _ := policyconfiguration.DockerReferenceIdentity(r.named)
	return id
}

func (r bundleRef) PolicyConfigurationNamespaces() []string {
	return policyconfiguration.DockerReferenceNamespaces(r.named)
}

func (r bundleRef) NewImage(context.Context, *types.SystemContext) (types.ImageCloser, error) {
	return nil, errNotInBundle
}

func (r bundleRef) NewImageSource(context.Context, *types.SystemContext) (types.ImageSource, error) {
	return nil, errNotInBundle
}

func (r bundleRef) NewImageDestination(context.Context, *types.SystemContext) (types.ImageDestination, error) {
	return nil, errors.New("the bundle is read-only")
}

func (r bundleRef) DeleteImage(context.Context, *types.SystemContext) error {
	return errors.New("the bundle is read-only")
}

// digest is the manifest the reference names in the bundle.
func (r bundleRef) digest() (godigest.Digest, error) {
	if c, ok := r.named.(reference.Canonical); ok {
		return c.Digest(), nil
	}
	t, ok := r.named.(reference.Tagged)
	if !ok {
		return "", fmt.Errorf("%s names no tag and no digest", r.named)
	}
	d, ok := r.tree.Tag(r.named.Name(), t.Tag())
	if !ok {
		return "", fmt.Errorf("%s: the tag is not in the bundle", r.named)
	}
	return godigest.Digest(d), nil
}

// source is the image CRI-O pulls for r: for a manifest list (or OCI
// index), the instance containers/image chooses for the node's platform,
// which is what its policy check then reads (copy.copySingleImage checks
// the instance, never the list), with that instance's own signatures.
func (r bundleRef) source() (*source, error) {
	d, err := r.digest()
	if err != nil {
		return nil, err
	}
	name := r.named.Name()
	m, ok := r.tree.Manifest(name, digest.Digest(d))
	if !ok {
		return nil, fmt.Errorf("manifest %s of %s is not in the bundle", d, name)
	}
	if mt := manifest.GuessMIMEType(m); manifest.MIMETypeIsMultiImage(mt) {
		list, err := manifest.ListFromBlob(m, mt)
		if err != nil {
			return nil, fmt.Errorf("manifest list %s of %s: %v", d, name, err)
		}
		inst, err := list.ChooseInstance(&types.SystemContext{OSChoice: "linux", ArchitectureChoice: r.arch})
		if err != nil {
			return nil, fmt.Errorf("manifest list %s of %s: %v", d, name, err)
		}
		d = inst
	}
	return &source{ref: r, top: d}, nil
}

// dockerLike names the transport "docker" so that the policy's docker
// scopes apply; nothing parses references through it.
type dockerLike struct{}

func (dockerLike) Name() string { return "docker" }
func (dockerLike) ParseReference(string) (types.ImageReference, error) {
	return nil, errors.New("not a parsing transport")
}
func (dockerLike) ValidatePolicyConfigurationScope(string) error { return nil }

// source is one image of the bundle as the policy code reads it: its
// manifest and sigstore signatures.
type source struct {
	ref bundleRef
	top godigest.Digest
}

// signatures are the sigstore signatures the bundle carries for the
// image's manifest: cosign's sha256-<hex>.sig tag in the same repository,
// one signature per layer, in containers/image's stored form (a zero
// byte, the format's name, a newline, its JSON), as its dir: transport
// keeps them.
func (s *source) signatures() ([][]byte, error) {
	name := s.ref.named.Name()
	sigDigest, ok := s.ref.tree.Tag(name, bundle.SignatureTag(s.top.String()))
	if !ok {
		return nil, nil
	}
	b, ok := s.ref.tree.Manifest(name, sigDigest)
	if !ok {
		return nil, fmt.Errorf("signature manifest %s of %s is not in the bundle", sigDigest, name)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("signature manifest %s of %s: %v", sigDigest, name, err)
	}
	var sigs [][]byte
	for _, l := range m.Layers {
		if l.MediaType != sigstoreMIMEType {
			continue
		}
		payload, ok := s.ref.tree.Blob(name, digest.Digest(l.Digest))
		if !ok {
			return nil, fmt.Errorf("signature payload %s of %s is not in the bundle", l.Digest, name)
		}
		chunk, err := json.Marshal(struct {
			MIMEType    string            `json:"mimeType"`
			Payload     []byte            `json:"payload"`
			Annotations map[string]string `json:"annotations"`
		}{l.MediaType, payload, l.Annotations})
		if err != nil {
			return nil, err
		}
		sigs = append(sigs, append([]byte("\x00sigstore-json\n"), chunk...))
	}
	return sigs, nil
}

// stage writes the image's manifest and signatures in the layout of
// containers/image's dir: transport (whose source hands sigstore
// signatures to the policy code as such) under dir, and returns the image
// as the policy sees it: those bytes, under the original name.
func (s *source) stage(dir string) (types.UnparsedImage, int, error) {
	name := s.ref.named.Name()
	m, ok := s.ref.tree.Manifest(name, digest.Digest(s.top))
	if !ok {
		return nil, 0, fmt.Errorf("manifest %s of %s is not in the bundle", s.top, name)
	}
	sigs, err := s.signatures()
	if err != nil {
		return nil, 0, err
	}
	files := map[string][]byte{"manifest.json": m}
	for i, sig := range sigs {
		files[fmt.Sprintf("signature-%d", i+1)] = sig
	}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			return nil, 0, err
		}
	}
	dref, err := directory.NewReference(dir)
	if err != nil {
		return nil, 0, err
	}
	src, err := dref.NewImageSource(context.Background(), nil)
	if err != nil {
		return nil, 0, err
	}
	return image.UnparsedInstanceWithReference(image.UnparsedInstance(src, nil), s.ref), len(sigs), nil
}
