// Package sha256digest is the one form of digest ferry passes around
// (bundles, pieces, blobs, images): "sha256:" and 64 lowercase hex digits,
// as go-digest validates it, and the one short form shown to people.
//
// Where a digest crosses from one of ferry's packages to another (a
// struct field, a parameter, a result) it is an internal/digest.Digest,
// not a string, so that the compiler says where a digest is meant. A
// value of that type is made at the edges, where text comes in (the
// network, a file, the API, the command line), by Parse (or FromHex), or
// by hashing (go-digest's, converted): inside ferry it is taken to be
// valid. Text an engineer typed and ferry reads as given, such as the
// approved_digests of a config (bare hex is accepted there), stays a
// string until it is parsed. The package links no more than strings and
// strconv: the agent's state machine uses it.
package sha256digest

import (
	"errors"
	"strconv"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Parse returns s as a digest if it is "sha256:" and 64 lowercase hex
// digits; any other algorithm or spelling is refused.
func Parse(s string) (digest.Digest, error) {
	alg, hex, ok := strings.Cut(s, ":")
	switch {
	case !ok:
		return "", errors.New(strconv.Quote(s) + " is not a sha256 digest: invalid checksum digest format")
	case alg != "sha256":
		return "", errors.New(strconv.Quote(s) + " is not a sha256 digest: algorithm " + alg)
	case !isHex64(hex):
		return "", errors.New(strconv.Quote(s) + " is not a sha256 digest: invalid checksum digest format")
	}
	return digest.Digest(s), nil
}

// isHex64 reports whether s is 64 lowercase hex digits.
func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Valid reports whether s is "sha256:" and 64 lowercase hex digits.
func Valid[S ~string](s S) bool {
	_, err := Parse(string(s))
	return err == nil
}

// FromHex is "sha256:"+hex, and whether hex is 64 lowercase hex digits.
func FromHex(hex string) (digest.Digest, bool) {
	return digest.Digest("sha256:" + hex), isHex64(hex)
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
