package bundle

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/ferry-edge/ferry/internal/imageref"
)

// Image references, in one place: how metadata.json writes them, how a
// bundle stores their repositories, and what a node pulls and pins.

var digestRefRE = regexp.MustCompile(`^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+(?::[\w][\w.-]{0,127})?@sha256:[0-9a-f]{64}$`)

// checkDigestRef accepts name@sha256:<hex> and name:tag@sha256:<hex> (a
// custom image given by tag keeps its tag).
func checkDigestRef(ref string) error {
	if !digestRefRE.MatchString(ref) {
		return fmt.Errorf("%q is not a registry/name[:tag]@sha256:<64 hex> reference", ref)
	}
	return nil
}

// SplitRef splits name[:tag]@sha256:hex into its name, tag ("" if none)
// and digest.
func SplitRef(ref string) (name, tag, digest string) { return imageref.Split(ref) }

// PullRefs are the references to pull for a bundle's images: each by
// digest (name@sha256:…, the tag dropped) and, for an image that kept its
// tag, also name:tag, so that both names are on the image and pinned.
func PullRefs(images []string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(r string) {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, ref := range images {
		name, tag, digest := SplitRef(ref)
		if digest != "" {
			add(name + "@" + digest)
		}
		if tag != "" {
			add(name + ":" + tag)
		}
		if digest == "" && tag == "" {
			add(name)
		}
	}
	return out
}

// RepoPath is name (registry/path, no tag or digest) without its registry
// host: the path a bundle stores it under when no other name collides.
func RepoPath(name string) string {
	name, _, _ = SplitRef(name)
	host, rest, ok := strings.Cut(name, "/")
	if !ok || !looksLikeHost(host) {
		return name
	}
	return rest
}

// RepoPaths maps each distinct repository name of refs (references as in
// metadata.json: name[:tag]@sha256:…, or bare names) to the repository path
// a bundle stores it under.
//
// The rule: a bundle stores every image under its original repository name
// with the registry host removed: quay.io/openshift-release-dev/ocp-v4.0-art-dev
// is stored, and served by the embedded registry, as the repository
// openshift-release-dev/ocp-v4.0-art-dev. A node's mirror configuration
// then maps the prefix quay.io/openshift-release-dev/ocp-v4.0-art-dev to
// 127.0.0.1:PORT/openshift-release-dev/ocp-v4.0-art-dev, the same path.
// Docker Hub names are docker.io/library/busybox → library/busybox.
//
// When two names of one bundle from different registries share a path
// (a.io/team/app and b.io/team/app), both keep their host as the first
// path component instead (a.io/team/app; a host:port is written host-port),
// repeated until no two names share a path. bundle create and the node's
// mirror configuration both call RepoPaths on metadata.AllImages(), so
// they always agree.
func RepoPaths(refs []string) map[string]string {
	out := map[string]string{}
	for _, r := range refs {
		n, _, _ := SplitRef(r)
		out[n] = RepoPath(n)
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	full := map[string]bool{} // names stored with their host
	for {
		byPath := map[string][]string{}
		for _, n := range names {
			byPath[out[n]] = append(byPath[out[n]], n)
		}
		changed := false
		for _, group := range byPath {
			if len(group) < 2 {
				continue
			}
			for _, n := range group {
				if !full[n] {
					full[n] = true
					out[n] = hostPath(n)
					changed = true
				}
			}
		}
		if !changed {
			return out
		}
	}
}

// hostPath is name with its host made a valid path component.
func hostPath(name string) string {
	host, rest, ok := strings.Cut(name, "/")
	if !ok {
		return name
	}
	return strings.ReplaceAll(strings.ToLower(host), ":", "-") + "/" + rest
}

// looksLikeHost tells a registry host from a first path component the way
// the docker reference grammar does: it has a dot or a port, or is
// localhost.
func looksLikeHost(s string) bool {
	return strings.ContainsAny(s, ".:") || s == "localhost"
}

// ReleaseRepo is where OpenShift's release images are published.
const ReleaseRepo = "quay.io/openshift-release-dev/ocp-release"

// ReleaseImage is the release image of version and arch, by the tag the
// release repository gives it (4.13.7-x86_64); bundle create resolves it
// to its digest, as the seed's `oc adm upgrade create bundle` does.
func ReleaseImage(version, arch string) string {
	return ReleaseRepo + ":" + version + "-" + arch
}
