// Package sha256digest is the one form of digest ferry passes around
// (bundles, pieces, blobs, images): "sha256:" and 64 lowercase hex digits,
// as go-digest validates it, and the one short form shown to people.
//
// Where a digest crosses from one of ferry's packages to another (a
// struct field, a parameter, a result) it is a digest.Digest, not a
// string, so that the compiler says where a digest is meant. A value of
// that type is made at the edges, where text comes in (the network, a
// file, the API, the command line), by Parse (or FromHex), or by hashing
// (digest.FromBytes, a digest.Digester): inside ferry it is taken to be
// valid. Text an engineer typed and ferry reads as given, such as the
// approved_digests of a config (bare hex is accepted there), stays a
// string until it is parsed.
package sha256digest

import (
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"
)

// Parse returns s as a digest if it is "sha256:" and 64 lowercase hex
// digits; any other algorithm or spelling is refused.
func Parse(s string) (digest.Digest, error) {
	d := digest.Digest(s)
	if err := d.Validate(); err != nil {
		return "", fmt.Errorf("%q is not a sha256 digest: %w", s, err)
	}
	if d.Algorithm() != digest.SHA256 {
		return "", fmt.Errorf("%q is not a sha256 digest: algorithm %s", s, d.Algorithm())
	}
	return d, nil
}

// Valid reports whether s is "sha256:" and 64 lowercase hex digits.
func Valid[S ~string](s S) bool {
	_, err := Parse(string(s))
	return err == nil
}

// FromHex is "sha256:"+hex, and whether hex is 64 lowercase hex digits.
func FromHex(hex string) (digest.Digest, bool) {
	d := digest.Digest("sha256:" + hex)
	return d, Valid(d)
}

// Short is the one short form of a digest shown to people: "sha256:" and
// the first 12 hex digits (a bare hex string is taken as sha256's).
func Short[S ~string](d S) string {
	h := strings.TrimPrefix(string(d), "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return "sha256:" + h
}
