package cvoverify

import "github.com/ferry-edge/ferry/kube"

// Trusting is the verifier of a release payload whose verification
// ConfigMap names one key, as OpenShift's names Red Hat's
// (verifier-public-key-redhat): armored, a GPG public key.
func Trusting(armored []byte, client *kube.Client) (*Verifier, error) {
	return New(map[string]string{"verifier-public-key-redhat": string(armored)}, client)
}
