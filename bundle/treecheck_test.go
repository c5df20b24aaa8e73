package bundle

import (
	"bytes"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/internal/imagetree"
)

// A bundle whose tar and .sha256 agree but whose tree does not hold what its
// metadata says is refused by Verify and Extract, naming the item, and
// leaves nothing behind (docs/design.md, "The tree check"). Each case is
// first built whole and accepted, so that it fails for what it breaks.
func TestExtract_RefusesATreeThatLacksWhatItsMetadataSays(t *testing.T) {
	layer := imagetree.Digest(imagetree.Layer("image", 4000))
	digestOf := func(ref string) string { _, d, _ := strings.Cut(ref, "@"); return d }
	const repo = "openshift-release-dev/ocp-v4.0-art-dev"

	for _, tc := range []struct {
		name string
		// build adds to tree what the case needs, breaks it when broken,
		// and returns the images it adds to the metadata.
		build  func(tree imagetree.Tree, broken bool) []string
		saying []string
	}{
		{"an image listed but absent", func(tree imagetree.Tree, broken bool) []string {
			if broken {
				delete(tree, imagetree.ManifestLink(repo, digestOf(testImage)))
			}
			return nil
		}, []string{"the image " + testImage, "manifest", "not in the bundle", "make it again"}},
		{"the release absent", func(tree imagetree.Tree, broken bool) []string {
			if broken {
				delete(tree, imagetree.BlobPath(digestOf(testRelease)))
			}
			return nil
		}, []string{"the release image " + testRelease, "not in the bundle"}},
		{"a layer blob missing", func(tree imagetree.Tree, broken bool) []string {
			if broken {
				delete(tree, testLayer)
			}
			return nil
		}, []string{testImage, "blob " + layer, "not in the bundle"}},
		{"a layer not linked to its repository", func(tree imagetree.Tree, broken bool) []string {
			if broken {
				delete(tree, imagetree.LayerLink(repo, layer))
			}
			return nil
		}, []string{testImage, "not linked"}},
		{"a blob whose bytes do not hash to its path", func(tree imagetree.Tree, broken bool) []string {
			if broken {
				tree[testLayer] = []byte(strings.Repeat("x", 4000))
			}
			return nil
		}, []string{"blob " + layer, "does not hash to its name"}},
		{"a manifest list's child absent", func(tree imagetree.Tree, broken bool) []string {
			amd := tree.Add("quay.io/team/app", imagetree.Layer("app", 0))
			arm := tree.Add("quay.io/team/app", imagetree.Layer("app-arm", 0))
			list := tree.AddList("quay.io/team/app:v1", amd, arm)
			if broken {
				delete(tree, imagetree.ManifestLink("team/app", digestOf(arm)))
			}
			return []string{list}
		}, []string{"quay.io/team/app:v1@", "in its list", "manifest " + digestOf(imagetree.Tree{}.Add("quay.io/team/app", imagetree.Layer("app-arm", 0))), "not in the bundle"}},
		{"a tag naming another manifest", func(tree imagetree.Tree, broken bool) []string {
			ref := tree.Add("quay.io/team/tool:v2", imagetree.Layer("tool", 0))
			if broken {
				old := tree.Add("quay.io/team/tool", imagetree.Layer("tool-old", 0))
				tree["repositories/team/tool/_manifests/tags/v2/current/link"] = []byte(digestOf(old))
			}
			return []string{ref}
		}, []string{"quay.io/team/tool:v2@", "tag v2 names"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, broken := range []bool{false, true} {
				tree := maps.Clone(testTree)
				meta := testMetadata(1 << 20)
				meta.Images = append(meta.Images, tc.build(tree, broken)...)
				src := stage(t, writeBundle(t, meta, treeEntries(tree)), "")
				scratch := t.TempDir()
				_, verr := Verify(t.Context(), src, Options{})
				_, err := Extract(t.Context(), src, filepath.Join(scratch, "out"), Options{})
				if !broken {
					if verr != nil || err != nil {
						t.Fatalf("the whole tree is refused: %v / %v", verr, err)
					}
					continue
				}
				for _, e := range []error{verr, err} {
					if !errors.Is(e, ErrInvalid) {
						t.Fatalf("got %v, want a refusal of an invalid bundle", e)
					}
					for _, s := range tc.saying {
						if !strings.Contains(e.Error(), s) {
							t.Errorf("%q does not say %q", e, s)
						}
					}
				}
				if ents, _ := os.ReadDir(scratch); len(ents) != 0 {
					t.Errorf("left %s behind", ents[0].Name())
				}
			}
		})
	}
}

// A tree that holds a repository or tag its metadata does not list is
// refused, naming it: a node would otherwise serve it through the mirror
// of a listed repository. Each case is first built with the extra listed
// too, and accepted.
func TestExtract_RefusesATreeThatHoldsMoreThanItsMetadataLists(t *testing.T) {
	for _, tc := range []struct {
		name string
		// build adds to tree what the case needs and returns the images
		// the metadata lists, and the extra one it lists only when whole.
		build  func(tree imagetree.Tree) (listed []string, extra string)
		saying string
	}{
		{"another tag of a listed repository", func(tree imagetree.Tree) ([]string, string) {
			return []string{tree.Add("quay.io/team/app:v1", imagetree.Layer("app", 0))}, tree.Add("quay.io/team/app:latest", imagetree.Layer("app-new", 0))
		}, "the tag team/app:latest"},
		{"a repository below a listed one", func(tree imagetree.Tree) ([]string, string) {
			return []string{tree.Add("quay.io/team/app:v1", imagetree.Layer("app", 0))}, tree.Add("quay.io/team/app/tools:latest", imagetree.Layer("tools", 0))
		}, "the repository team/app/tools"},
		{"a repository by digest only", func(tree imagetree.Tree) ([]string, string) {
			return nil, tree.Add("quay.io/other/thing", imagetree.Layer("thing", 0))
		}, "the repository other/thing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, broken := range []bool{false, true} {
				tree := maps.Clone(testTree)
				meta := testMetadata(1 << 20)
				listed, extra := tc.build(tree)
				meta.Images = append(meta.Images, listed...)
				if !broken {
					meta.Images = append(meta.Images, extra)
				}
				err := refusal(t, meta, treeEntries(tree))
				if !broken {
					if err != nil {
						t.Fatalf("the tree with everything listed is refused: %v", err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tc.saying) || !strings.Contains(err.Error(), "does not list") {
					t.Fatalf("got %v, want a refusal saying %q", err, tc.saying)
				}
			}
		})
	}
	t.Run("an empty repository directory", func(t *testing.T) {
		err := refusal(t, testMetadata(1<<20), append(validEntries(), dir(RegistryRoot+"repositories/team/empty/")))
		if err == nil || !strings.Contains(err.Error(), "the repository team/empty") {
			t.Fatalf("got %v", err)
		}
	})
}

// refusal is Verify's and Extract's refusal of the bundle (nil when both
// accept it), checked to be the same kind, an invalid bundle, with
// nothing left behind.
func refusal(t *testing.T, meta *Metadata, entries []entry) error {
	t.Helper()
	src := stage(t, writeBundle(t, meta, entries), "")
	scratch := t.TempDir()
	_, verr := Verify(t.Context(), src, Options{})
	out := filepath.Join(scratch, "out")
	_, err := Extract(t.Context(), src, out, Options{})
	if (verr == nil) != (err == nil) {
		t.Fatalf("Verify says %v, Extract %v", verr, err)
	}
	if err == nil {
		os.RemoveAll(out)
		return nil
	}
	if !errors.Is(verr, ErrInvalid) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %v / %v, want refusals of an invalid bundle", verr, err)
	}
	if ents, _ := os.ReadDir(scratch); len(ents) != 0 {
		t.Errorf("left %s behind", ents[0].Name())
	}
	return err
}

// A blob damaged on its way (the .sha256 is the bundle's own) is a bad
// copy, said as such: "copy it again", not "make it again".
func TestExtract_ADamagedBlobIsABadCopyNotALyingBundle(t *testing.T) {
	good := writeBundle(t, testMetadata(1<<20), validEntries())
	bad := bytes.Clone(good)
	bad[bytes.Index(bad, imagetree.Layer("image", 4000))+100] ^= 1
	_, err := Verify(t.Context(), stage(t, bad, sum(good)), Options{})
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "copy it again") {
		t.Fatalf("got %v", err)
	}
}

// A tag that names a manifest the metadata lists in the same repository
// (upgrade-tool tags every image it copies :latest) adds nothing: the
// tree is accepted; the registry does not serve the tag.
func TestExtract_AcceptsAnUnlistedTagOfAListedManifest(t *testing.T) {
	tree := maps.Clone(testTree)
	meta := testMetadata(1 << 20)
	layer := imagetree.Layer("app", 0)
	ref := tree.Add("quay.io/team/app", layer)
	tree.Add("quay.io/team/app:latest", layer) // the same manifest, tagged
	meta.Images = append(meta.Images, ref)
	if err := refusal(t, meta, treeEntries(tree)); err != nil {
		t.Fatalf("an unlisted tag of a listed manifest: %v", err)
	}
}
