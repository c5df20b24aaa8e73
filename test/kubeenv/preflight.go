package kubeenv

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/crioenv"
)

// What a preflight reads, as the test plays the operators that write it.

const clusterOperatorsPath = "/apis/config.openshift.io/v1/clusteroperators"

// InstallClusterOperators applies OpenShift's ClusterOperator CRD (cached
// by test/setup/build-apiserver.sh).
func (e *Env) InstallClusterOperators() {
	e.t.Helper()
	crd := filepath.Join(e.bin, "clusteroperators.crd.yaml")
	_, err := os.Stat(crd)
	crioenv.Need(e.t, err == nil, "no ClusterOperator CRD in %s (a cache from before it was added): run bash test/setup/build-apiserver.sh", e.bin)
	e.ApplyFile(crd)
	deadline := time.Now().Add(30 * time.Second)
	for e.Admin.Raw(context.Background(), "GET", clusterOperatorsPath, "", nil, nil) != nil {
		if time.Now().After(deadline) {
			e.t.Fatal("the ClusterOperator CRD never became established")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// SetClusterOperator creates a ClusterOperator and writes its status
// conditions, as its operator does.
func (e *Env) SetClusterOperator(name string, conds ...Condition) {
	e.t.Helper()
	e.Create(clusterOperatorsPath, map[string]any{"apiVersion": "config.openshift.io/v1", "kind": "ClusterOperator",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{}})
	var cs []any
	for _, c := range conds {
		cs = append(cs, map[string]any{"type": c.Type, "status": c.Status, "reason": c.Reason, "message": c.Message,
			"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)})
	}
	must(e.t, e.Admin.Raw(context.Background(), "PATCH", clusterOperatorsPath+"/"+name+"/status", "application/merge-patch+json",
		map[string]any{"status": map[string]any{"conditions": cs}}, nil))
}

// SetConfigMap creates or replaces a ConfigMap's data (admin-gates,
// admin-acks).
func (e *Env) SetConfigMap(ns, name string, data map[string]string) {
	e.t.Helper()
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	err := e.Admin.Raw(context.Background(), "PATCH", path+"/"+name, "application/merge-patch+json", map[string]any{"data": data}, nil)
	if kube.IsNotFound(err) {
		err = e.Admin.Raw(context.Background(), "POST", path, "application/json", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": ns}, "data": data}, nil)
	}
	must(e.t, err)
}

// CreatePod creates a pod of one container on node (no kubelet runs it),
// in a namespace made for it.
func (e *Env) CreatePod(ns, name, node, image, pullPolicy string) {
	e.t.Helper()
	e.Create("/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	e.Create("/api/v1/namespaces/"+ns+"/serviceaccounts", map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}})
	e.Create("/api/v1/namespaces/"+ns+"/pods", map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"automountServiceAccountToken": false, "nodeName": node,
			"containers": []any{map[string]any{"name": "main", "image": image, "imagePullPolicy": pullPolicy}}}})
}
