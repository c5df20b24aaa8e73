package imagetree

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
)

// Sigstore signature artifacts as cosign writes them: an OCI manifest
// tagged sha256-<hex>.sig in the signed image's repository, one layer per
// signature whose payload names the image and whose annotation holds an
// ECDSA signature over that payload.
const (
	MediaOCIManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaSigstore    = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation holds the base64 signature of a layer's payload.
	SignatureAnnotation = "dev.cosignproject.cosign/signature"
	mediaOCIConfig      = "application/vnd.oci.image.config.v1+json"
)

// NewSigningKey is an ECDSA P-256 key, and its public half as PEM (what a
// policy.json's sigstoreSigned keyPath names).
func NewSigningKey() (*ecdsa.PrivateKey, []byte) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		panic(err)
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// SigstorePayload is cosign's simple-signing payload for manifest digest
// d of the image identity (a repository, or repository:tag).
func SigstorePayload(identity, d string) []byte {
	b, _ := json.Marshal(map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": identity},
			"image":    map[string]string{"docker-manifest-digest": d},
			"type":     "cosign container image signature",
		},
		"optional": nil,
	})
	return b
}

// SignPayload is the base64 ECDSA signature of payload's sha256.
func SignPayload(k *ecdsa.PrivateKey, payload []byte) string {
	sum := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, k, sum[:])
	if err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

// SignatureManifest is a cosign signature artifact's manifest and its
// blobs (config, then each payload), for one payload per key.
func SignatureManifest(identity, d string, keys ...*ecdsa.PrivateKey) (manifest []byte, blobs [][]byte) {
	config := []byte(`{"architecture":"","os":"","config":{},"rootfs":{"type":"layers","diff_ids":[]}}`)
	payload := SigstorePayload(identity, d)
	var layers []any
	for _, k := range keys {
		layers = append(layers, map[string]any{
			"mediaType":   MediaSigstore,
			"digest":      Digest(payload),
			"size":        len(payload),
			"annotations": map[string]string{SignatureAnnotation: SignPayload(k, payload)},
		})
	}
	m, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     MediaOCIManifest,
		"config":        map[string]any{"mediaType": mediaOCIConfig, "digest": Digest(config), "size": len(config)},
		"layers":        layers,
	})
	return m, [][]byte{config, payload}
}

// Sign stores a sigstore signature by key of the image ref
// (name[:tag]@sha256:…, as Add returns it) for identity ("" for ref's
// repository), tagged as cosign tags it, and returns the signature's
// reference name:sha256-<hex>.sig@sha256:….
func (t Tree) Sign(ref, identity string, key *ecdsa.PrivateKey) string {
	name, d, _ := strings.Cut(ref, "@")
	repo, _ := split(name)
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	if identity == "" {
		identity = name
	}
	m, blobs := SignatureManifest(identity, d, key)
	for _, b := range blobs {
		t.blob(b)
		t[LayerLink(repo, Digest(b))] = []byte(Digest(b))
	}
	tag := strings.Replace(d, ":", "-", 1) + ".sig"
	return t.manifest(name+":"+tag, repo, tag, m)
}
