// Package releasesig signs test releases the way Red Hat signs OpenShift
// releases, and checks a signature the way the nodes' containers/image
// does. A release signature is an OpenPGP signed message (not a detached
// signature) whose literal data is the "atomic container signature"
// (simple signing) JSON naming the release's repository[:tag] and its
// manifest digest; the version operator verifies it against its keyring
// (test/cvoverify does, as the operator does).
package releasesig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"go.podman.io/image/v5/signature"
	//lint:ignore SA1019 what the version operator and containers/image verify with
	"golang.org/x/crypto/openpgp"        //nolint:staticcheck
	"golang.org/x/crypto/openpgp/armor"  //nolint:staticcheck
	"golang.org/x/crypto/openpgp/packet" //nolint:staticcheck

	"github.com/ferry-edge/ferry/internal/imageref"
)

// Placeholder is what the tests wrote as a release signature before they
// signed for real: bytes no version operator accepts.
var Placeholder = []byte("signature of 4.13.7")

// Key is a release-signing key pair, the test's stand-in for Red Hat's
// (the version operator's verifier-public-key-redhat).
type Key struct {
	entity *openpgp.Entity
}

var (
	testKey  *Key
	testOnce sync.Once
)

// Test is the key every test of one process signs with: made once (an
// RSA key takes a while), shared by all.
func Test() *Key {
	testOnce.Do(func() { testKey = NewKey() })
	return testKey
}

// NewKey makes a new RSA-2048 signing key.
func NewKey() *Key {
	e, err := openpgp.NewEntity("ferry test release signing", "", "release-signing@ferry.test", nil)
	if err != nil {
		panic(fmt.Sprintf("releasesig: %v", err))
	}
	// Prefer SHA-256 (as gpg does): without a preference openpgp.Sign
	// wants RIPEMD-160, which is not compiled in. The self-signature is
	// made again to cover it.
	for name, id := range e.Identities {
		id.SelfSignature.PreferredHash = []uint8{8} // SHA-256
		if err := id.SelfSignature.SignUserId(name, e.PrimaryKey, e.PrivateKey, nil); err != nil {
			panic(fmt.Sprintf("releasesig: %v", err))
		}
	}
	return &Key{entity: e}
}

// Keyring is the public key, as an openpgp keyring.
func (k *Key) Keyring() openpgp.EntityList { return openpgp.EntityList{k.entity} }

// PublicArmored is the public key ASCII-armored, as the version
// operator's verifier ConfigMap and policy.json's keyPath hold it.
func (k *Key) PublicArmored() []byte {
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PublicKeyType, nil)
	if err == nil {
		err = k.entity.Serialize(w)
	}
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		panic(fmt.Sprintf("releasesig: %v", err))
	}
	return b.Bytes()
}

// payload is the simple-signing JSON, with Red Hat's fields.
type payload struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional struct {
		Creator   string `json:"creator"`
		Timestamp int64  `json:"timestamp"`
	} `json:"optional"`
}

// Sign signs the image with manifest digest (sha256:…) as identity
// (repository[:tag], the docker-reference): an OpenPGP signed message,
// compressed as gpg --sign writes it.
func (k *Key) Sign(identity, digest string) []byte {
	var p payload
	p.Critical.Identity.DockerReference = identity
	p.Critical.Image.DockerManifestDigest = digest
	p.Critical.Type = "atomic container signature"
	p.Optional.Creator = "Red Hat OpenShift Signing Authority 0.0.1 (ferry test key)"
	p.Optional.Timestamp = time.Now().Unix()
	data, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	var out bytes.Buffer
	z, err := packet.SerializeCompressed(nopCloser{&out}, packet.CompressionZLIB, nil)
	if err != nil {
		panic(err)
	}
	w, err := openpgp.Sign(z, k.entity, &openpgp.FileHints{IsBinary: true}, nil) // literal data mode b, as gpg --sign
	if err == nil {
		_, err = w.Write(data)
	}
	if err == nil {
		err = w.Close()
	}
	if err == nil {
		err = z.Close()
	}
	if err != nil {
		panic(fmt.Sprintf("releasesig: signing %s: %v", identity, err))
	}
	return out.Bytes()
}

// SignRelease signs release (name[:tag]@sha256:…) as Red Hat signs an
// OpenShift release: the identity is the repository with the release's
// tag, <version>-<arch> (quay.io/openshift-release-dev/ocp-release:
// 4.13.7-x86_64), whatever tag the reference carries.
func (k *Key) SignRelease(release, version, arch string) []byte {
	name, _, digest := imageref.Split(release)
	if digest == "" {
		panic("releasesig: " + release + " is not a digest reference")
	}
	return k.Sign(name+":"+version+"-"+arch, digest)
}

// Verify checks sig as a node's containers/image does (simple signing,
// signedBy GPGKeys): signed by k, vouching for manifest as identity.
// It returns the digest the signature names.
func (k *Key) Verify(sig, manifest []byte, identity string) (string, error) {
	mech, ids, err := signature.NewEphemeralGPGSigningMechanism(k.PublicArmored())
	if err != nil {
		return "", err
	}
	defer mech.Close()
	s, _, err := signature.VerifyImageManifestSignatureUsingKeyIdentityList(sig, manifest, identity, mech, ids)
	if err != nil {
		return "", err
	}
	return s.DockerManifestDigest.String(), nil
}

type nopCloser struct{ *bytes.Buffer }

func (nopCloser) Close() error { return nil }

// Signatures are the signatures a test release carries: one, by Test(),
// of release as Red Hat signs <version>-x86_64.
func Signatures(release, version string) [][]byte {
	return [][]byte{Test().SignRelease(release, version, "x86_64")}
}
