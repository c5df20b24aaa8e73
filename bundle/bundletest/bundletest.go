// Package bundletest writes small valid bundles for tests of the packages
// that consume them.
package bundletest

import (
	"archive/tar"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/imagetree"
)

// Options describe a test bundle.
type Options struct {
	Version string   // default "4.13.7"
	Arch    string   // default "x86_64"
	Images  []string // names (registry/repo[:tag]) of its images besides the release; default one
	// LayerSize is each image's one layer in bytes (default 24 KiB): what
	// makes a bundle big enough to need several pieces.
	LayerSize int
	NoSHA     bool // do not write the .sha256 sidecar
	// SignKey, when set, signs the release sigstore-style (cosign's
	// sha256-<hex>.sig attachment, listed in metadata's signatures);
	// SignAll signs every image with it too.
	SignKey *ecdsa.PrivateKey
	SignAll bool
	// SignIdentity, when set, is the identity (critical.identity.
	// docker-reference) each signature names, given the signed image's
	// reference (name[:tag]@sha256:…); "" or nil names its repository
	// only, as cosign does.
	SignIdentity func(ref string) string
	// Listed stores each of Images as a manifest list of its one
	// linux/amd64 instance; SignInstances then signs (SignAll) the
	// instances instead of the lists.
	Listed, SignInstances bool
}

// DefaultImage is the image a bundle holds when Options.Images is empty.
const DefaultImage = "quay.io/openshift-release-dev/ocp-v4.0-art-dev"

// Ref is the reference (name[:tag]@sha256:…) a bundle written with
// layerSize lists for the image name.
func Ref(name string, layerSize int) string {
	return imagetree.Tree{}.Add(name, imagetree.Layer(name, layerSize))
}

// Write makes upgrade-<version>-<arch>.tar (+ .sha256) in dir, holding
// complete images (every blob, manifest and link), and returns the tar's
// path and digest.
func Write(t testing.TB, dir string, o Options) (string, digest.Digest) {
	t.Helper()
	if o.Version == "" {
		o.Version = "4.13.7"
	}
	if o.Arch == "" {
		o.Arch = "x86_64"
	}
	if o.Images == nil {
		o.Images = []string{DefaultImage}
	}
	tree := imagetree.Tree{}
	release := tree.Add("quay.io/openshift-release-dev/ocp-release", imagetree.Layer("release "+o.Version+"-"+o.Arch, 0))
	var refs, instances []string
	for _, n := range o.Images {
		ref := tree.Add(n, imagetree.Layer(n, o.LayerSize))
		if o.Listed {
			instances = append(instances, ref)
			ref = tree.AddList(n, ref)
		}
		refs = append(refs, ref)
	}
	var sigs []string
	identity := func(ref string) string {
		if o.SignIdentity == nil {
			return ""
		}
		return o.SignIdentity(ref)
	}
	if o.SignKey != nil {
		sigs = append(sigs, tree.Sign(release, identity(release), o.SignKey))
		signed := refs
		if o.SignInstances {
			signed = instances
		}
		for _, r := range signed {
			if o.SignAll {
				sigs = append(sigs, tree.Sign(r, identity(r), o.SignKey))
			}
		}
	}
	size := tree.Size()
	meta := bundle.Metadata{
		FormatVersion: 1, Version: o.Version, Arch: o.Arch, SizeBytes: size + 4096, Size: bundle.HumanSize(size + 4096),
		Release:    release,
		Images:     refs,
		Signatures: sigs,
		Created:    time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	}
	mb, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, meta.Name()+".tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	tw := tar.NewWriter(teeWriter{f, h})
	write := func(hdr *tar.Header, body string) {
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	write(&tar.Header{Name: bundle.MetadataName, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mb))}, string(mb))
	names := make([]string, 0, len(tree))
	for n := range tree {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		write(&tar.Header{Name: bundle.RegistryRoot + n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(tree[n]))}, string(tree[n]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	d := digest.FromSHA256(h.Sum(nil))
	if !o.NoSHA {
		line := d.Encoded() + "  " + filepath.Base(p) + "\n"
		if err := os.WriteFile(strings.TrimSuffix(p, ".tar")+".sha256", []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return p, d
}

type teeWriter struct {
	f *os.File
	h interface{ Write([]byte) (int, error) }
}

func (w teeWriter) Write(b []byte) (int, error) {
	w.h.Write(b)
	return w.f.Write(b)
}
