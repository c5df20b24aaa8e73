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

// A bundle whose tar and .sha256 agree but whose tree does not hold what
// its metadata says is refused by Verify and Extract, naming the item,
// and leaves nothing behind (DESIGN.md §3.5). Each case is first built
// whole and accepted, so that it fails for what it breaks.
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
