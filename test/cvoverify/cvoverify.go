// Copyright The OpenShift Authors.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//	http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// Package cvoverify is the cluster version operator's release verifier,
// copied so that the tests check ferry's signature ConfigMap and
// desiredUpdate as the operator does: neither the operator's module nor
// library-go is served by the Go module proxy that CI reaches.
//
// Copied, with klog, the signature cache, the other stores and the
// persister left out, from github.com/openshift/library-go (Apache-2.0)
// v0.0.0-20260413093329-d2db42c961e1, as vendored by
// github.com/openshift/cluster-version-operator at commit
// 6e719331fb5863141397f35b1f47bed42148a6dd:
//   - pkg/verify/verify.go: releaseVerifier.Verify,
//     verifySignatureWithKeyring, verifyAtomicContainerSignature and the
//     signature types;
//   - pkg/verify/configmap.go: loadArmoredOrUnarmoredGPGKeyRing and the
//     verifier-public-key-* keys of newFromConfigMapData;
//   - pkg/verify/store/configmap/configmap.go: Store.Signatures (a LIST
//     of the labelled ConfigMaps in openshift-config-managed, every
//     binaryData key starting with the digest's prefix);
//   - pkg/verify/util/util.go: DigestToKeyPrefix;
//
// and from the operator itself, pkg/cvo/updatepayload.go's
// RetrievePayload: the digest verified is what follows the last "@" of
// desiredUpdate.image.
package cvoverify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"

	//lint:ignore SA1019 what the operator verifies with
	"golang.org/x/crypto/openpgp" //nolint:staticcheck

	"github.com/ferry-edge/ferry/kube"
)

// Verifier verifies release digests as the operator does: every keyring
// must have signed the digest, in a signature found in the cluster's
// signature ConfigMaps.
type Verifier struct {
	verifiers map[string]openpgp.EntityList
	client    *kube.Client
}

// New is the verifier the operator builds from the release payload's
// verification ConfigMap data (verifier-public-key-<name>: a GPG public
// key, armored or not), reading signatures through client as the
// operator's configmap.Store does.
func New(data map[string]string, client *kube.Client) (*Verifier, error) {
	verifiers := make(map[string]openpgp.EntityList)
	for k, v := range data {
		if strings.HasPrefix(k, verifierPublicKeyPrefix) {
			keyring, err := loadArmoredOrUnarmoredGPGKeyRing([]byte(v))
			if err != nil {
				return nil, fmt.Errorf("%s has an invalid key %q that must be a GPG public key: %v", "the verification config map", k, err)
			}
			verifiers[k] = keyring
		}
	}
	if len(verifiers) == 0 {
		return nil, fmt.Errorf("the verification config map did not provide any GPG public keys to verify signatures from and cannot be used")
	}
	return &Verifier{verifiers: verifiers, client: client}, nil
}

const verifierPublicKeyPrefix = "verifier-public-key-"

// VerifyDesiredUpdate verifies ClusterVersion's spec.desiredUpdate as
// RetrievePayload does before it downloads the release: the digest is
// what follows the image's last "@" (none: refused).
func (v *Verifier) VerifyDesiredUpdate(ctx context.Context) error {
	var cv struct {
		Spec struct {
			DesiredUpdate *struct {
				Image string `json:"image"`
			} `json:"desiredUpdate"`
		} `json:"spec"`
	}
	if err := v.client.Raw(ctx, "GET", "/apis/config.openshift.io/v1/clusterversions/version", "", nil, &cv); err != nil {
		return err
	}
	if cv.Spec.DesiredUpdate == nil || len(cv.Spec.DesiredUpdate.Image) == 0 {
		return fmt.Errorf("no payload image has been specified and the contents of the payload cannot be retrieved")
	}
	image := cv.Spec.DesiredUpdate.Image
	var releaseDigest string
	if index := strings.LastIndex(image, "@"); index != -1 {
		releaseDigest = image[index+1:]
	}
	if err := v.Verify(ctx, releaseDigest); err != nil {
		return fmt.Errorf("The update cannot be verified: %w", err)
	}
	return nil
}

// validReleaseDigest is a verification rule to filter clearly invalid digests.
var validReleaseDigest = regexp.MustCompile(`^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$`)

// Verify ensures that at least one valid signature exists for an image with digest
// matching release digest in any of the provided locations for all verifiers, or returns
// an error.
func (v *Verifier) Verify(ctx context.Context, releaseDigest string) error {
	if len(v.verifiers) == 0 || v.client == nil {
		return fmt.Errorf("the release verifier is incorrectly configured, unable to verify digests")
	}
	if len(releaseDigest) == 0 {
		return fmt.Errorf("release images that are not accessed via digest cannot be verified")
	}
	if !validReleaseDigest.MatchString(releaseDigest) {
		return fmt.Errorf("the provided release image digest has an invalid format: %q", releaseDigest)
	}

	remaining := make(map[string]openpgp.EntityList, len(v.verifiers))
	for k, v := range v.verifiers {
		remaining[k] = v
	}

	var errs []error
	err := v.signatures(ctx, releaseDigest, func(ctx context.Context, signature []byte, errIn error) (done bool, err error) {
		if errIn != nil {
			errs = append(errs, fmt.Errorf("%s: %w", time.Now().Format(time.RFC3339), errIn))
			return false, nil
		}
		for k, keyring := range remaining {
			content, _, err := verifySignatureWithKeyring(bytes.NewReader(signature), keyring)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", time.Now().Format(time.RFC3339), err))
				continue
			}
			if err := verifyAtomicContainerSignature(content, releaseDigest); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", time.Now().Format(time.RFC3339), err))
				continue
			}
			delete(remaining, k)
		}
		return len(remaining) == 0, nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", time.Now().Format(time.RFC3339), err))
	}

	if len(remaining) > 0 {
		remainingKeyRings := make([]string, 0, len(remaining))
		for k := range remaining {
			remainingKeyRings = append(remainingKeyRings, k)
		}
		sort.Strings(remainingKeyRings)
		return &wrapError{
			msg: fmt.Sprintf("unable to verify %s against keyrings: %s", releaseDigest, strings.Join(remainingKeyRings, ", ")),
			err: errors.Join(errs...), // the operator: k8s.io/apimachinery's errors.NewAggregate
		}
	}
	return nil
}

// wrapError says only msg, as the operator's does; Unwrap gives why.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

// errNotFound is store.ErrNotFound.
var errNotFound = errors.New("no more signatures to check")

// callback is store.Callback.
type callback func(ctx context.Context, signature []byte, errIn error) (done bool, err error)

// Where the operator's configmap.Store looks.
const (
	namespaceLabelConfigMap = "openshift-config-managed"
	releaseLabelConfigMap   = "release.openshift.io/verification-signatures"
)

// signatures is configmap.Store.Signatures (without its rate limit and
// cache): signatures for the provided digest out of config maps labelled
// with releaseLabelConfigMap in the namespaceLabelConfigMap namespace.
func (v *Verifier) signatures(ctx context.Context, digest string, fn callback) error {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			BinaryData map[string][]byte `json:"binaryData"`
		} `json:"items"`
	}
	path := "/api/v1/namespaces/" + namespaceLabelConfigMap + "/configmaps?labelSelector=" + url.QueryEscape(releaseLabelConfigMap)
	if err := v.client.Raw(ctx, "GET", path, "", nil, &list); err != nil {
		return err
	}

	prefix, err := digestToKeyPrefix(digest, "-")
	if err != nil {
		return err
	}

	for _, cm := range list.Items {
		for k, v := range cm.BinaryData {
			if strings.HasPrefix(k, prefix) {
				done, err := fn(ctx, v, nil)
				if err != nil || done {
					return err
				}
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
		if done, err := fn(ctx, nil, fmt.Errorf("prefix %s in config map %s: %w", prefix, cm.Metadata.Name, errNotFound)); err != nil || done {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// digestToKeyPrefix changes digest to use the provided newDivider in place of ':',
// {algo}{newDivider}{hash} instead of {algo}:{hash}, because colons are not allowed
// in various places such as ConfigMap keys.
func digestToKeyPrefix(digest string, newDivider string) (string, error) {
	parts := strings.SplitN(digest, ":", 3)
	if len(parts) != 2 || len(parts[0]) == 0 || len(parts[1]) == 0 {
		return "", fmt.Errorf("the provided digest must be of the form ALGO:HASH")
	}
	algo, hash := parts[0], parts[1]
	return fmt.Sprintf("%s%s%s", algo, newDivider, hash), nil
}

func loadArmoredOrUnarmoredGPGKeyRing(data []byte) (openpgp.EntityList, error) {
	keyring, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(data))
	if err == nil {
		return keyring, nil
	}
	keyring, err2 := openpgp.ReadKeyRing(bytes.NewReader(data))
	if err2 == nil {
		return keyring, nil
	}
	return nil, fmt.Errorf("unable to read keyring with armor (%w) or without armor (%w)", err, err2)
}

// verifySignatureWithKeyring performs a containers/image verification of the provided signature
// message, checking for the integrity and authenticity of the provided message in r. It will return
// the identity of the signer if successful along with the message contents.
func verifySignatureWithKeyring(r io.Reader, keyring openpgp.EntityList) ([]byte, string, error) {
	md, err := openpgp.ReadMessage(r, keyring, nil, nil)
	if err != nil {
		return nil, "", fmt.Errorf("could not read the message: %v", err)
	}
	if !md.IsSigned {
		return nil, "", fmt.Errorf("not signed")
	}
	content, err := io.ReadAll(md.UnverifiedBody)
	if err != nil {
		return nil, "", err
	}
	if md.SignatureError != nil {
		return nil, "", fmt.Errorf("signature error: %v", md.SignatureError)
	}
	if md.SignedBy == nil {
		return nil, "", fmt.Errorf("invalid signature")
	}
	if md.Signature != nil {
		if md.Signature.SigLifetimeSecs != nil {
			expiry := md.Signature.CreationTime.Add(time.Duration(*md.Signature.SigLifetimeSecs) * time.Second)
			if time.Now().After(expiry) {
				return nil, "", fmt.Errorf("signature expired on %s", expiry)
			}
		}
	} else if md.SignatureV3 == nil {
		return nil, "", fmt.Errorf("unexpected openpgp.MessageDetails: neither Signature nor SignatureV3 is set")
	}

	// follow conventions in containers/image
	return content, strings.ToUpper(fmt.Sprintf("%x", md.SignedBy.PublicKey.Fingerprint)), nil
}

// An atomic container signature has the following schema:
//
//	{
//		"critical": {
//				"type": "atomic container signature",
//				"image": {
//						"docker-manifest-digest": "sha256:817a12c32a39bbe394944ba49de563e085f1d3c5266eb8e9723256bc4448680e"
//				},
//				"identity": {
//						"docker-reference": "docker.io/library/busybox:latest"
//				}
//		},
//		"optional": {
//				"creator": "some software package v1.0.1-35",
//				"timestamp": 1483228800,
//		}
//	}
type signature struct {
	Critical criticalSignature `json:"critical"`
	Optional optionalSignature `json:"optional"`
}

type criticalSignature struct {
	Type     string           `json:"type"`
	Image    criticalImage    `json:"image"`
	Identity criticalIdentity `json:"identity"`
}

type criticalImage struct {
	DockerManifestDigest string `json:"docker-manifest-digest"`
}

type criticalIdentity struct {
	DockerReference string `json:"docker-reference"`
}

type optionalSignature struct {
	Creator   string `json:"creator"`
	Timestamp int64  `json:"timestamp"`
}

// verifyAtomicContainerSignature verifiers that the provided data authenticates the
// specified release digest. If error is returned the provided data does NOT authenticate
// the release digest and the signature must be ignored.
func verifyAtomicContainerSignature(data []byte, releaseDigest string) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	var sig signature
	if err := d.Decode(&sig); err != nil {
		return fmt.Errorf("the signature is not valid JSON: %v", err)
	}
	if sig.Critical.Type != "atomic container signature" {
		return fmt.Errorf("signature is not the correct type")
	}
	if len(sig.Critical.Identity.DockerReference) == 0 {
		return fmt.Errorf("signature must have an identity")
	}
	if sig.Critical.Image.DockerManifestDigest != releaseDigest {
		return fmt.Errorf("signature digest does not match")
	}
	return nil
}
