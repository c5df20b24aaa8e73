package kube

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/test/releasesig"
)

const testRelease = "quay.io/openshift-release-dev/ocp-release@sha256:2222222222222222222222222222222222222222222222222222222222222222"

// signatureAPI plays the API server for StartUpgrade: the signature
// ConfigMap exists already, and answer decides each write.
func signatureAPI(t *testing.T, answer func(r *http.Request) (int, string)) (*Client, *[]string) {
	var mu sync.Mutex
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.Method == "PUT" && strings.Contains(string(body), "resourceVersion") {
			t.Errorf("PUT with a resourceVersion: %s", body)
		}
		code, msg := answer(r)
		if code == 0 {
			json.NewEncoder(w).Encode(map[string]any{"spec": map[string]any{}})
			return
		}
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"reason": http.StatusText(code), "message": msg})
	}))
	t.Cleanup(srv.Close)
	return &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}, &calls
}

// An existing signature ConfigMap is replaced without reading it (ferry's
// Role grants no get on it).
func TestStartUpgrade_ReplacesSignaturesBlind(t *testing.T) {
	c, calls := signatureAPI(t, func(r *http.Request) (int, string) {
		if r.Method == "POST" {
			return http.StatusConflict, "already exists"
		}
		return 0, ""
	})
	if err := c.StartUpgrade(t.Context(), cluster.Upgrade{Release: testRelease, Version: "4.13.7", Signatures: releasesig.Signatures(testRelease, "4.13.7")}); err != nil {
		t.Fatal(err)
	}
	cm := "/api/v1/namespaces/openshift-config-managed/configmaps"
	want := []string{"POST " + cm, "PUT " + cm + "/sha256-" + strings.Repeat("2", 64), "GET " + clusterVersionPath, "PATCH " + clusterVersionPath}
	if strings.Join(*calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(*calls, "\n"), strings.Join(want, "\n"))
	}
}

// ferry-admission's refusal of an unapproved release is
// cluster.ErrReleaseUnapproved, the policy's command kept; any other 403
// is not.
func TestStartUpgrade_UnapprovedReleaseIsItsOwnError(t *testing.T) {
	refusal := `configmaps "sha256-2222" is forbidden: ValidatingAdmissionPolicy 'ferry-release-signatures' with binding 'ferry-release-signatures' denied request: ferry: release sha256-2222 is not approved by the administrator; approve it with: oc -n openshift-ferry patch configmap ferry-admission ...`
	c, _ := signatureAPI(t, func(r *http.Request) (int, string) { return http.StatusForbidden, refusal })
	err := c.StartUpgrade(t.Context(), cluster.Upgrade{Release: testRelease, Version: "4.13.7", Signatures: releasesig.Signatures(testRelease, "4.13.7")})
	if !errors.Is(err, cluster.ErrReleaseUnapproved) || !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "oc -n openshift-ferry patch configmap ferry-admission") || strings.Contains(err.Error(), "rbac.yaml") {
		t.Errorf("err %v: want ErrReleaseUnapproved (a 403) with the policy's command, no advice on RBAC", err)
	}
	c, _ = signatureAPI(t, func(r *http.Request) (int, string) {
		if r.Method == "PATCH" {
			return http.StatusForbidden, strings.Replace(refusal, "ferry-release-signatures", "ferry-clusterversion", 2)
		}
		return 0, ""
	})
	if err := c.StartUpgrade(t.Context(), cluster.Upgrade{Release: testRelease, Version: "4.13.7"}); !errors.Is(err, cluster.ErrReleaseUnapproved) {
		t.Errorf("desiredUpdate refused: %v, want ErrReleaseUnapproved", err)
	}
	c, _ = signatureAPI(t, func(r *http.Request) (int, string) { return http.StatusForbidden, "RBAC: access denied" })
	err = c.StartUpgrade(t.Context(), cluster.Upgrade{Release: testRelease, Version: "4.13.7", Signatures: releasesig.Signatures(testRelease, "4.13.7")})
	if errors.Is(err, cluster.ErrReleaseUnapproved) || !errors.Is(err, ErrForbidden) {
		t.Errorf("an RBAC refusal: %v, want ErrForbidden only", err)
	}
}
