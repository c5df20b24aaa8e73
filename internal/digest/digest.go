// Package digest is the type of a digest as ferry's packages pass it:
// "sha256:" and 64 lowercase hex digits (internal/sha256digest makes and
// checks them). It is a leaf of the standard library's smallest packages
// so that the agent's state machine can name digests without linking
// go-digest, which brings fmt, regexp and crypto: hashing is
// go-digest's, at the edges (bundle, peer, bundle/create), converted to
// this type where its result enters ferry.
package digest

import "strings"

// Digest is "sha256:<hex>", taken to be valid inside ferry.
type Digest string

// String is d as text.
func (d Digest) String() string { return string(d) }

// Encoded is the hex after "sha256:" (all of d when it has no
// algorithm).
func (d Digest) Encoded() string {
	if _, hex, ok := strings.Cut(string(d), ":"); ok {
		return hex
	}
	return string(d)
}

// FromSHA256 is the digest of a sha256 sum (a hash.Hash's Sum): what
// go-digest's NewDigestFromBytes(SHA256, sum) makes, without linking it.
func FromSHA256(sum []byte) Digest {
	const hexDigits = "0123456789abcdef"
	b := make([]byte, 0, len("sha256:")+2*len(sum))
	b = append(b, "sha256:"...)
	for _, c := range sum {
		b = append(b, hexDigits[c>>4], hexDigits[c&0x0f])
	}
	return Digest(b)
}
