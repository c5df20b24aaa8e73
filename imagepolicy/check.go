// Package imagepolicy decides, before a bundle leaves its staging dir,
// whether the node's container signature policy (policy.json, the file
// CRI-O applies to every pull) admits each image ferry will pull, with the
// sigstore signatures the bundle carries. It runs containers/image's own
// policy code, so what it refuses CRI-O would refuse too, hours later.
package imagepolicy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/signature"

	"github.com/ferry-edge/ferry/bundle"
)

// DefaultPath is where CRI-O and the MCO keep the node's policy.
const DefaultPath = "/etc/containers/policy.json"

// Checker holds one node's policy file.
type Checker struct {
	// Path is policy.json; "" for DefaultPath. A missing file admits
	// everything, as it does today for a node with no policy.
	Path string
}

func (c Checker) path() string {
	if c.Path == "" {
		return DefaultPath
	}
	return c.Path
}

// Admit is a bundle.Options.Admit: every reference ferry pulls (each
// image by digest, and by tag where it kept one) must be allowed by the
// policy; the first that is not refuses the bundle, naming it and the
// requirement it fails. One exception: a tag refused only for the
// identity its image's signatures name (no signature names name:tag, as
// signedIdentity matchRepoDigestOrExact or matchExact wants), while the
// same image by digest is allowed, is dropped: the image is loaded by
// digest only, as the Admission's DigestOnly and Warnings say.
func (c Checker) Admit(meta *bundle.Metadata, tree bundle.Tree) (bundle.Admission, error) {
	var adm bundle.Admission
	raw, err := os.ReadFile(c.path())
	if errors.Is(err, os.ErrNotExist) {
		return adm, nil
	}
	if err != nil {
		return adm, fmt.Errorf("%w: reading %s: %v", bundle.ErrPolicy, c.path(), err)
	}
	policy, err := signature.NewPolicyFromBytes(raw)
	if err != nil {
		return adm, fmt.Errorf("%w: %s does not parse, so CRI-O cannot pull anything either: fix it (%v)", bundle.ErrPolicy, c.path(), err)
	}
	pc, err := signature.NewPolicyContext(policy)
	if err != nil {
		return adm, fmt.Errorf("%w: %s: %v", bundle.ErrPolicy, c.path(), err)
	}
	defer pc.Destroy()
	// The policy code reads images through a transport: each is staged in
	// containers/image's dir: layout (a manifest and its signatures, a few
	// KiB) and removed after.
	tmp, err := os.MkdirTemp("", "ferry-policy-")
	if err != nil {
		return adm, fmt.Errorf("checking the signature policy: %w", err)
	}
	defer os.RemoveAll(tmp)
	e := &evaluator{raw: raw, tree: tree, tmp: tmp, arch: bundle.GoArch(meta.Arch), verdicts: map[string]error{}}
	defer e.close()
	for _, img := range meta.AllImages() {
		name, tag, _ := bundle.SplitRef(img)
		byDigest := false
		for _, s := range bundle.PullRefs([]string{img}) {
			ref, denied, err := e.check(pc, s)
			if err != nil {
				return adm, err
			}
			_, canonical := ref.named.(reference.Canonical)
			if denied == nil {
				byDigest = byDigest || canonical
				continue
			}
			if byDigest && tag != "" && s == name+":"+tag {
				only, err := e.identityOnly(ref)
				if err != nil {
					return adm, err
				}
				if only {
					adm.DigestOnly = append(adm.DigestOnly, img)
					adm.Warnings = append(adm.Warnings, c.digestOnly(e, ref))
					continue
				}
			}
			return adm, c.refusal(e, ref, denied)
		}
	}
	return adm, nil
}

// evaluator asks the policy about the bundle's references.
type evaluator struct {
	raw      []byte
	tree     bundle.Tree
	tmp      string
	arch     string           // the node's GOARCH
	verdicts map[string]error // by reference: nil allowed, else why not
	relaxed  *signature.PolicyContext
	// noRelax: the policy names no identity rule to relax.
	noRelax bool
}

func (e *evaluator) close() {
	if e.relaxed != nil {
		e.relaxed.Destroy()
	}
}

// check asks pc whether the image s names may run: denied is the
// policy's reason if not; err a bundle that cannot be read.
func (e *evaluator) check(pc *signature.PolicyContext, s string) (ref bundleRef, denied, err error) {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return ref, nil, fmt.Errorf("%w: %s: %v", bundle.ErrInvalid, s, err)
	}
	ref = bundleRef{named: named, tree: e.tree, arch: e.arch}
	if v, ok := e.verdicts[s]; ok && pc != e.relaxed {
		return ref, v, nil
	}
	src, err := ref.source()
	if err != nil {
		return ref, nil, fmt.Errorf("%w: %v", bundle.ErrInvalid, err)
	}
	dir, err := os.MkdirTemp(e.tmp, "image-")
	if err != nil {
		return ref, nil, err
	}
	defer os.RemoveAll(dir)
	img, _, err := src.stage(dir)
	if err != nil {
		return ref, nil, fmt.Errorf("%w: %v", bundle.ErrInvalid, err)
	}
	if ok, why := pc.IsRunningImageAllowed(context.Background(), img); !ok {
		denied = why
		if denied == nil {
			denied = errors.New("refused")
		}
	}
	if pc != e.relaxed {
		e.verdicts[s] = denied
	}
	return ref, denied, nil
}

// refusal says which image failed which requirement, and what to do.
func (c Checker) refusal(e *evaluator, ref bundleRef, denied error) error {
	what := describe(e.raw, ref)
	why := fmt.Sprintf("%v", denied)
	fix := "make the bundle from images signed as the node's policy requires, or change the policy"
	ids, n := e.identities(ref)
	switch {
	case n == 0:
		why = "the bundle carries none"
		fix = "make it again with a ferry that copies signatures, from a source that holds them"
	case allNameOnly(ids):
		if rule := identityRule(e.raw, ref); rule != "matchRepository" && rule != "" {
			if only, err := e.identityOnly(ref); err == nil && only {
				why = fmt.Sprintf("its signature names the repository only (%s), which signedIdentity %s never accepts, by digest or by tag", quoted(ids), rule)
				fix = fmt.Sprintf(`sign the image for name:tag (or name@digest), or give %s signedIdentity {"type":"matchRepository"} in the policy (matchPolicy MatchRepository in a ClusterImagePolicy)`, ref.named.Name())
			}
		}
	}
	return fmt.Errorf("%w: %s: this node requires %s (%s); %s: %s",
		bundle.ErrPolicy, ref.named, what, c.path(), why, fix)
}

// digestOnly is the warning for a tag dropped by identityOnly.
func (c Checker) digestOnly(e *evaluator, ref bundleRef) string {
	tag := ref.named.(reference.Tagged).Tag()
	ids, _ := e.identities(ref)
	return fmt.Sprintf("%s is loaded by digest only: its signature names %s, not this tag; this node's policy (signedIdentity %s, %s) accepts it by digest only, so the tag %s is not loaded and a pull of it by tag fails on this node",
		ref.named, quoted(ids), identityRule(e.raw, ref), c.path(), tag)
}

// requirements are those the policy applies to ref, read the way
// containers/image reads the scopes: the reference's identity, then its
// namespaces, then the transport's default, then the policy's. false:
// the policy does not decode.
func requirements(raw []byte, ref bundleRef) ([]map[string]any, bool) {
	var p struct {
		Default    []map[string]any                       `json:"default"`
		Transports map[string]map[string][]map[string]any `json:"transports"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return nil, false
	}
	scopes := p.Transports["docker"]
	for _, scope := range append([]string{ref.PolicyConfigurationIdentity()}, ref.PolicyConfigurationNamespaces()...) {
		if r, ok := scopes[scope]; ok {
			return r, true
		}
	}
	if r, ok := scopes[""]; ok {
		return r, true
	}
	return p.Default, true
}

// describe names the requirements the policy applies to ref, e.g. "a
// sigstore signature by the key in /etc/pki/sigstore.pub".
func describe(raw []byte, ref bundleRef) string {
	reqs, ok := requirements(raw, ref)
	if !ok {
		return "what its policy says"
	}
	var parts []string
	for _, r := range reqs {
		parts = append(parts, describeOne(r))
	}
	if len(parts) == 0 {
		return "nothing it can satisfy (no requirement)"
	}
	return strings.Join(parts, " and ")
}

func describeOne(r map[string]any) string {
	str := func(k string) string { s, _ := r[k].(string); return s }
	switch str("type") {
	case "sigstoreSigned":
		switch {
		case str("keyPath") != "":
			return "a sigstore signature by the key in " + str("keyPath")
		case r["keyPaths"] != nil:
			return fmt.Sprintf("a sigstore signature by one of the keys in %v", r["keyPaths"])
		case str("keyData") != "" || r["keyDatas"] != nil:
			return "a sigstore signature by the key given inline in the policy"
		case r["fulcio"] != nil:
			return "a sigstore signature with a Fulcio certificate"
		}
		return "a sigstore signature"
	case "signedBy":
		return "a GPG (simple signing) signature, which ferry does not carry: only sigstore attachments travel in a bundle"
	case "reject":
		return "nothing: the policy rejects these images outright"
	case "insecureAcceptAnything":
		return "nothing"
	}
	return "a requirement of type " + str("type")
}
