package cluster

import "testing"

func TestApproveCommand(t *testing.T) {
	hex := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	got := ApproveCommand("quay.io/openshift-release-dev/ocp-release@sha256:" + hex)
	want := `oc -n openshift-ferry patch configmap ferry-admission --type merge -p '{"data":{"sha256-` + hex + `":"approved"}}'`
	if got != want {
		t.Errorf("ApproveCommand = %s\nwant %s", got, want)
	}
	for _, bad := range []string{"quay.io/x:4.13.7", "quay.io/x@sha256:" + hex[:63], "quay.io/x@sha256:" + hex + "0", ""} {
		if c := ApproveCommand(bad); c != "" {
			t.Errorf("ApproveCommand(%q) = %q, want none", bad, c)
		}
	}
}
