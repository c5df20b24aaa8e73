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
// requirement it fails.
func (c Checker) Admit(meta *bundle.Metadata, tree bundle.Tree) error {
	raw, err := os.ReadFile(c.path())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: reading %s: %v", bundle.ErrPolicy, c.path(), err)
	}
	policy, err := signature.NewPolicyFromBytes(raw)
	if err != nil {
		return fmt.Errorf("%w: %s does not parse, so CRI-O cannot pull anything either: fix it (%v)", bundle.ErrPolicy, c.path(), err)
	}
	pc, err := signature.NewPolicyContext(policy)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", bundle.ErrPolicy, c.path(), err)
	}
	defer pc.Destroy()
	// The policy code reads images through a transport: each is staged in
	// containers/image's dir: layout (a manifest and its signatures, a few
	// KiB) and removed after.
	tmp, err := os.MkdirTemp("", "ferry-policy-")
	if err != nil {
		return fmt.Errorf("checking the signature policy: %w", err)
	}
	defer os.RemoveAll(tmp)
	ctx := context.Background()
	for _, s := range bundle.PullRefs(meta.AllImages()) {
		named, err := reference.ParseNormalizedNamed(s)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", bundle.ErrInvalid, s, err)
		}
		ref := bundleRef{named: named, tree: tree}
		src, err := ref.source()
		if err != nil {
			return fmt.Errorf("%w: %v", bundle.ErrInvalid, err)
		}
		dir, err := os.MkdirTemp(tmp, "image-")
		if err != nil {
			return err
		}
		img, nsigs, err := src.stage(dir)
		if err != nil {
			return fmt.Errorf("%w: %v", bundle.ErrInvalid, err)
		}
		if ok, err := pc.IsRunningImageAllowed(ctx, img); !ok {
			return c.refusal(raw, ref, nsigs, err)
		}
	}
	return nil
}

// refusal says which image failed which requirement, and what to do.
func (c Checker) refusal(raw []byte, ref bundleRef, nsigs int, err error) error {
	what := describe(raw, ref)
	why := fmt.Sprintf("%v", err)
	fix := "make the bundle from images signed as the node's policy requires, or change the policy"
	if nsigs == 0 {
		why = "the bundle carries none"
		fix = "make it again with a ferry that copies signatures, from a source that holds them"
	}
	return fmt.Errorf("%w: %s: this node requires %s (%s); %s: %s",
		bundle.ErrPolicy, ref.named, what, c.path(), why, fix)
}

// describe names the requirements the policy applies to ref, e.g. "a
// sigstore signature by the key in /etc/pki/sigstore.pub". It reads the
// scopes the way containers/image does: the reference's identity, then
// its namespaces, then the transport's default, then the policy's.
func describe(raw []byte, ref bundleRef) string {
	var p struct {
		Default    []map[string]any                       `json:"default"`
		Transports map[string]map[string][]map[string]any `json:"transports"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return "what its policy says"
	}
	reqs, found := p.Default, false
	scopes := p.Transports["docker"]
	for _, scope := range append([]string{ref.PolicyConfigurationIdentity()}, ref.PolicyConfigurationNamespaces()...) {
		if r, ok := scopes[scope]; ok {
			reqs, found = r, true
			break
		}
	}
	if r, ok := scopes[""]; !found && ok {
		reqs = r
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
