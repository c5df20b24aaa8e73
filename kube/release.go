package kube

import "strings"

// sameRelease tells whether two pull specs name one release image: by
// digest whatever the spelling (with or without a tag, another registry
// host or repository: oc adm upgrade --to-image name@sha256:… writes what
// it was given), else by their text.
func sameRelease(a, b string) bool {
	da, db := releaseDigest(a), releaseDigest(b)
	if da != "" || db != "" {
		return da == db
	}
	return a == b
}

// releaseDigest is the sha256 hex a pull spec names ("" when it names
// none).
func releaseDigest(ref string) string {
	i := strings.LastIndex(ref, "@")
	if i < 0 {
		return ""
	}
	hex, ok := strings.CutPrefix(ref[i+1:], "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(strings.ToLower(hex), "0123456789abcdef") != "" {
		return ""
	}
	return strings.ToLower(hex)
}
