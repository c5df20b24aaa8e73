package bundle_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/internal/digest"
)

func TestPolicy_APeersApprovedDigestIsApprovedAndSaysSo(t *testing.T) {
	p, dgst := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	src, err := bundle.FindSource(p, "")
	if err != nil {
		t.Fatal(err)
	}
	pol := bundle.Policy{ApprovedDigests: []string{"sha256:" + strings.Repeat("0", 64)}, SpaceFactor: -1}
	if _, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol}); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("not approved here: %v", err)
	}
	meta, err := bundle.InspectFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.ApproveOffer(pol, meta, dgst, nil); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("an offer of an unapproved digest: %v", err)
	}
	pol.ApprovedDigests = append(pol.ApprovedDigests, string(dgst))
	if how, err := bundle.ApproveOffer(pol, meta, dgst, nil); err != nil || how != "digest" {
		t.Fatalf("offer: %q, %v", how, err)
	}
	res, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol.PreApproved(dgst)})
	if err != nil || res.Approval != "peer" {
		t.Fatalf("fetched: %+v, %v", res, err)
	}
	other := pol.PreApproved(digest.Digest("sha256:" + strings.Repeat("1", 64)))
	if _, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: other}); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("a fetched bundle whose digest is not the pre-approved one: %v", err)
	}
}

// Approval travels: a node whose trusted_keys hold the signer approves a
// peer's bundle by the signature that comes with the offer, then verifies
// it over the bytes it extracts; another key, no signature or a bad one
// is refused before a byte is fetched.
func TestPolicy_APeersSignatureApprovesWithThisNodesKeys(t *testing.T) {
	p, dgst := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	pub, priv, _ := minisign.GenerateKey(nil)
	otherPub, otherPriv, _ := minisign.GenerateKey(nil)
	signWith := func(k minisign.PrivateKey) []byte {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sig, err := bundle.SignReader(k, f)
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	sig, otherSig := signWith(priv), signWith(otherPriv)
	meta, err := bundle.InspectFile(p)
	if err != nil {
		t.Fatal(err)
	}
	pol := bundle.Policy{TrustedKeys: []bundle.TrustedKey{bundle.TrustKey(pub)}, SpaceFactor: -1}
	if how, err := bundle.ApproveOffer(pol, meta, dgst, sig); err != nil || how != "signature" {
		t.Fatalf("signed by a trusted key: %q, %v", how, err)
	}
	for name, s := range map[string][]byte{"no signature": nil, "another key": otherSig, "garbage": []byte("untrusted comment: x\nnot base64\n")} {
		if _, err := bundle.ApproveOffer(pol, meta, dgst, s); !errors.Is(err, bundle.ErrNotApproved) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A trusted key's signature of another bundle offered with this one:
	// the key ID alone approved it before; the signed comment names the
	// digest, and the offer is refused before a byte is fetched.
	lying := digest.Digest("sha256:" + strings.Repeat("e", 64))
	if _, err := bundle.ApproveOffer(pol, meta, lying, sig); !errors.Is(err, bundle.ErrNotApproved) || !strings.Contains(err.Error(), "with a signature of bundle "+string(dgst)) {
		t.Errorf("a signature of another bundle: %v", err)
	}
	// One whose comment names no digest (minisign's own, or an older
	// ferry's) cannot approve an offer; one whose comment was edited fails
	// its comment signature.
	plain := minisign.Sign(priv, []byte("the same key, any message"))
	if _, err := bundle.ApproveOffer(pol, meta, dgst, plain); !errors.Is(err, bundle.ErrNotApproved) || !strings.Contains(err.Error(), "names no sha256") {
		t.Errorf("a signature naming no digest: %v", err)
	}
	var edited minisign.Signature
	if err := edited.UnmarshalText(sig); err != nil {
		t.Fatal(err)
	}
	edited.TrustedComment = strings.Replace(edited.TrustedComment, dgst.Encoded(), strings.Repeat("e", 64), 1)
	editedText, _ := edited.MarshalText()
	if _, err := bundle.ApproveOffer(pol, meta, lying, editedText); !errors.Is(err, bundle.ErrNotApproved) || !strings.Contains(err.Error(), "not signed by key") {
		t.Errorf("an edited trusted comment: %v", err)
	}
	if _, err := bundle.ApproveOffer(bundle.Policy{TrustedKeys: []bundle.TrustedKey{bundle.TrustKey(otherPub)}}, meta, dgst, sig); err == nil || !strings.Contains(err.Error(), "not one of this node's trusted_keys") {
		t.Errorf("a node without the signer's key: %v", err)
	}

	// The fetched bytes are verified with the signature that came along.
	if err := os.WriteFile(p+".minisig", sig, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := bundle.FindSource(p, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol})
	if err != nil || res.Approval != "signature" || string(res.Signature) != string(sig) {
		t.Fatalf("extracting with the travelling signature: %+v, %v", res, err)
	}
	if err := os.WriteFile(p+".minisig", otherSig, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol}); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("a signature that does not verify: %v", err)
	}
}
