package imagepolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/signature"
)

// The identity a sigstore signature names (critical.identity.
// docker-reference) meets the policy's signedIdentity. Under
// matchRepoDigestOrExact (containers/image's default) and matchExact, a
// signature naming name:tag admits the pull by that tag (and by digest);
// one naming another tag, or name@digest, admits the pull by digest only;
// one naming the repository only (cosign's default) admits neither.
// Under matchRepository every one of them admits both.

// relaxable are the signedIdentity rules under which a pull by digest can
// pass where the same image by tag fails for its identity alone; "" is
// signedIdentity left out (matchRepoDigestOrExact).
var relaxable = map[string]bool{"": true, "matchRepoDigestOrExact": true, "matchExact": true}

// identityOnly reports whether ref fails the policy for the identity its
// signatures name and nothing else: with every relaxable signedIdentity
// of the policy made matchRepository, containers/image admits it.
func (e *evaluator) identityOnly(ref bundleRef) (bool, error) {
	if e.relaxed == nil && !e.noRelax {
		raw, ok := relaxIdentities(e.raw)
		if !ok {
			e.noRelax = true
			return false, nil
		}
		policy, err := signature.NewPolicyFromBytes(raw)
		if err == nil {
			e.relaxed, err = signature.NewPolicyContext(policy)
		}
		if err != nil {
			e.noRelax = true
			return false, nil
		}
	}
	if e.noRelax {
		return false, nil
	}
	_, denied, err := e.check(e.relaxed, ref.named.String())
	return err == nil && denied == nil, err
}

// relaxIdentities is the policy with each sigstoreSigned requirement's
// relaxable signedIdentity made matchRepository, and whether there was
// one.
func relaxIdentities(raw []byte) ([]byte, bool) {
	var p map[string]any
	if json.Unmarshal(raw, &p) != nil {
		return nil, false
	}
	changed := false
	relax := func(reqs any) {
		list, _ := reqs.([]any)
		for _, r := range list {
			m, ok := r.(map[string]any)
			if !ok || m["type"] != "sigstoreSigned" {
				continue
			}
			id, _ := m["signedIdentity"].(map[string]any)
			if t, _ := id["type"].(string); relaxable[t] {
				m["signedIdentity"] = map[string]any{"type": "matchRepository"}
				changed = true
			}
		}
	}
	relax(p["default"])
	transports, _ := p["transports"].(map[string]any)
	for _, scopes := range transports {
		m, _ := scopes.(map[string]any)
		for _, reqs := range m {
			relax(reqs)
		}
	}
	b, err := json.Marshal(p)
	return b, changed && err == nil
}

// identityRule is the signedIdentity type of the first sigstoreSigned
// requirement the policy applies to ref ("" when there is none).
func identityRule(raw []byte, ref bundleRef) string {
	reqs, _ := requirements(raw, ref)
	for _, r := range reqs {
		if r["type"] != "sigstoreSigned" {
			continue
		}
		id, _ := r["signedIdentity"].(map[string]any)
		if t, _ := id["type"].(string); t != "" {
			return t
		}
		return "matchRepoDigestOrExact"
	}
	return ""
}

// identities are the identities the bundle's signatures of ref's image
// name, as their payloads say (unverified: for messages only), and how
// many signatures it carries.
func (e *evaluator) identities(ref bundleRef) ([]string, int) {
	src, err := ref.source()
	if err != nil {
		return nil, 0
	}
	sigs, err := src.signatures()
	if err != nil {
		return nil, len(sigs)
	}
	var ids []string
	seen := map[string]bool{}
	for _, sig := range sigs {
		var chunk struct {
			Payload []byte `json:"payload"`
		}
		var payload struct {
			Critical struct {
				Identity struct {
					DockerReference string `json:"docker-reference"`
				} `json:"identity"`
			} `json:"critical"`
		}
		_, body, _ := bytes.Cut(sig, []byte("\n"))
		if json.Unmarshal(body, &chunk) != nil || json.Unmarshal(chunk.Payload, &payload) != nil {
			continue
		}
		id := payload.Critical.Identity.DockerReference
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, len(sigs)
}

// allNameOnly: every identity names a repository only.
func allNameOnly(ids []string) bool {
	for _, id := range ids {
		named, err := reference.ParseNormalizedNamed(id)
		if err != nil || !reference.IsNameOnly(named) {
			return false
		}
	}
	return len(ids) > 0
}

// quoted lists identities for a message.
func quoted(ids []string) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", id)
	}
	return b.String()
}
