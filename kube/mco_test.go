package kube

import (
	"encoding/json"
	"testing"
)

func TestPoolOf_TheMCOsChoiceOfPool(t *testing.T) {
	var pools []pool
	if err := json.Unmarshal([]byte(`[
	 {"metadata":{"name":"master"},"spec":{"nodeSelector":{"matchLabels":{"node-role.kubernetes.io/master":""}}}},
	 {"metadata":{"name":"worker"},"spec":{"nodeSelector":{"matchLabels":{"node-role.kubernetes.io/worker":""}}}},
	 {"metadata":{"name":"infra"},"spec":{"nodeSelector":{"matchExpressions":[{"key":"node-role.kubernetes.io/infra","operator":"Exists"}]}}},
	 {"metadata":{"name":"gpu"},"spec":{"nodeSelector":{"matchExpressions":[{"key":"accel","operator":"In","values":["a100","h100"]}]}}},
	 {"metadata":{"name":"none"},"spec":{}}
	]`), &pools); err != nil {
		t.Fatal(err)
	}
	for want, labels := range map[string]map[string]string{
		"worker": {"node-role.kubernetes.io/worker": ""},
		"infra":  {"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/infra": ""},
		"master": {"node-role.kubernetes.io/master": "", "node-role.kubernetes.io/worker": ""},
		"gpu":    {"node-role.kubernetes.io/worker": "", "accel": "h100"},
		"":       {"accel": "t4"},
	} {
		got := ""
		if p := poolOf(pools, labels); p != nil {
			got = p.Metadata.Name
		}
		if got != want {
			t.Errorf("labels %v: pool %q, want %q", labels, got, want)
		}
	}
}
