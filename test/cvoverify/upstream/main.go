//go:build ignore

// Command ferry-cvo-verify is the cluster version operator's own release
// verification, built from the operator's source (with the library-go it
// vendors), run against a cluster: what the operator does before it
// downloads the release ClusterVersion's spec.desiredUpdate names.
//
//   - the verifier: verify.NewFromManifests over the release payload's
//     verification ConfigMap (verifier-public-key-redhat: the key given
//     with -key; a store-* it needs, here unreachable), then the
//     cluster's signature ConfigMaps added as a store, as pkg/cvo's
//     loadConfigMapVerifierDataFromUpdate does;
//   - the digest: what follows the last "@" of desiredUpdate.image, as
//     pkg/cvo's RetrievePayload takes it.
//
// It exits 0 and prints "verified <digest>", or exits 1 with the
// operator's message ("The update cannot be verified: …").
//
// The tests cannot build it (the Go module proxy does not serve the
// operator; test/cvoverify is the copy they run). To build it:
//
//	git clone https://github.com/openshift/cluster-version-operator /tmp/cvo
//	git -C /tmp/cvo checkout 6e719331fb5863141397f35b1f47bed42148a6dd
//	mkdir /tmp/cvo/cmd/ferry-cvo-verify
//	sed 1,2d test/cvoverify/upstream/main.go >/tmp/cvo/cmd/ferry-cvo-verify/main.go
//	(cd /tmp/cvo && go build -mod=vendor -o /tmp/ferry-cvo-verify ./cmd/ferry-cvo-verify)
//
// and FERRY_CVO_VERIFY=/tmp/ferry-cvo-verify makes test/kube's
// TestSignatures_TheVersionOperatorsVerifierAcceptsFerrysRequest check
// every case with it too.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	configclient "github.com/openshift/client-go/config/clientset/versioned"
	"github.com/openshift/library-go/pkg/manifest"
	"github.com/openshift/library-go/pkg/verify"
	"github.com/openshift/library-go/pkg/verify/store/configmap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of a user who may list ConfigMaps in openshift-config-managed and get ClusterVersion")
	keyFile := flag.String("key", "", "the trusted GPG public key (armored)")
	flag.Parse()
	if err := run(*kubeconfig, *keyFile); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}

func run(kubeconfig, keyFile string) error {
	key, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	// The release payload's verification ConfigMap, as OpenShift's
	// carries it (one key, one official store).
	raw, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "release-verification", "namespace": "openshift-config-managed",
			"annotations": map[string]any{verify.ReleaseAnnotationConfigMapVerifier: ""}},
		"data": map[string]any{"verifier-public-key-redhat": string(key),
			"store-openshift-official-release": "http://127.0.0.1:1/pub/openshift-v4/signatures/openshift/release"},
	})
	if err != nil {
		return err
	}
	manifests, err := manifest.ParseManifests(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	httpClient := func() (*http.Client, error) { return &http.Client{Timeout: 2 * time.Second}, nil }
	verifier, err := verify.NewFromManifests(manifests, httpClient)
	if err != nil || verifier == nil {
		return fmt.Errorf("verifier: %v", err)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	verifier.AddStore(configmap.NewStore(kc.CoreV1(), nil))

	cc, err := configclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cv, err := cc.ConfigV1().ClusterVersions().Get(ctx, "version", metav1.GetOptions{})
	if err != nil {
		return err
	}
	update := cv.Spec.DesiredUpdate
	if update == nil || len(update.Image) == 0 {
		return fmt.Errorf("no payload image has been specified and the contents of the payload cannot be retrieved")
	}
	var releaseDigest string
	if index := strings.LastIndex(update.Image, "@"); index != -1 {
		releaseDigest = update.Image[index+1:]
	}
	if err := verifier.Verify(ctx, releaseDigest); err != nil {
		return fmt.Errorf("The update cannot be verified: %v", err)
	}
	fmt.Println("verified", releaseDigest)
	return nil
}
