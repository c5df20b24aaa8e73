package bundle

import "fmt"

// On reports whether approval is configured at all.
func (p Policy) On() bool { return len(p.ApprovedDigests) > 0 || len(p.TrustedKeys) > 0 }

// ApproveOffer applies arch and approval to a bundle a peer offers, before
// any byte of it is fetched: the peer shows its metadata and digest only,
// so with approval on, the digest itself must be approved. It returns how
// it was approved ("digest" or "off").
func (p Policy) ApproveOffer(meta *Metadata, digest string) (string, error) {
	if p.Arch != "" && meta.Arch != p.Arch {
		return "", fmt.Errorf("%w: the peers' bundle is for %s, this node is %s", ErrWrongArch, meta.Arch, p.Arch)
	}
	if !p.On() {
		return "off", nil
	}
	for _, d := range p.ApprovedDigests {
		if NormalizeDigest(d) == digest {
			return "digest", nil
		}
	}
	return "", fmt.Errorf("%w: the peers' bundle %s is not in approved_digests: approve it on every node", ErrNotApproved, digest)
}

// PreApproved is the policy for extracting a bundle whose digest was
// approved before it was fetched (ApproveOffer): that digest, and nothing
// else, is approved, and the result says "peer"; with approval off it
// stays off.
func (p Policy) PreApproved(digest string) Policy {
	if p.On() {
		p.ApprovedDigests, p.TrustedKeys, p.ApprovedByPeer = nil, nil, digest
	}
	return p
}
