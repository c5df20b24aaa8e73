package bundle

import (
	"fmt"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/internal/digest"
)

// ApproveOffer applies p's arch and approval to a bundle a peer offers, before
// any byte of it is fetched: the peer shows its metadata, digest and
// signature (sig, its .minisig; nil when it has none). It returns how it
// was approved: ApprovalDigest, ApprovalOff, or ApprovalSignature when
// sig is by one of the trusted keys; the signature itself is then
// verified over the bytes as they are extracted (a Source with SigPath,
// under this policy).
func ApproveOffer(p Policy, meta *Metadata, digest digest.Digest, sig []byte) (Approval, error) {
	if p.Arch != "" && meta.Arch != p.Arch {
		return "", fmt.Errorf("%w: the peers' bundle is for %s, this node is %s", ErrWrongArch, meta.Arch, p.Arch)
	}
	// Parsed whatever the policy: the signature is kept and offered on.
	if sig != nil && CheckSignature(sig, "the peers' signature") != nil {
		return "", fmt.Errorf("%w: the peers' bundle %s carries a signature that does not parse: ask the engineer to sign it again", ErrNotApproved, digest)
	}
	if !p.On() {
		return ApprovalOff, nil
	}
	for _, d := range p.ApprovedDigests {
		if NormalizeDigest(d) == digest {
			return ApprovalDigest, nil
		}
	}
	if p.SourceFor(digest, meta) != nil {
		return ApprovalSource, nil
	}
	if len(p.TrustedKeys) == 0 {
		return "", fmt.Errorf("%w: the peers' bundle %s is not in approved_digests: approve it on every node (add it to approved_digests, or sign it with a trusted key)", ErrNotApproved, digest)
	}
	if sig == nil {
		return "", fmt.Errorf("%w: the peers' bundle %s is not in approved_digests and carries no signature: approve it on every node", ErrNotApproved, digest)
	}
	var s minisign.Signature
	if err := s.UnmarshalText(sig); err != nil {
		return "", fmt.Errorf("%w: the peers' bundle %s carries a signature that does not parse (%v): ask the engineer to sign it again", ErrNotApproved, digest, err)
	}
	for _, k := range publicKeys(p.TrustedKeys) {
		if k.ID() != s.KeyID {
			continue
		}
		// The key ID alone says nothing: the signature must name this
		// digest, in a comment the key signed, before a byte is fetched.
		named, err := CommentDigest(k, s)
		if err != nil {
			return "", fmt.Errorf("%w: the peers' bundle %s: %v", ErrNotApproved, digest, err)
		}
		if named != digest {
			return "", fmt.Errorf("%w: the peers offer bundle %s with a signature of bundle %s: refused before fetching (a peer offering what it was not given)", ErrNotApproved, digest, named)
		}
		return ApprovalSignature, nil
	}
	return "", fmt.Errorf("%w: the peers' bundle %s is signed by key %X, which is not one of this node's trusted_keys: add the engineer's public key here, or approve the digest", ErrNotApproved, digest, s.KeyID)
}
