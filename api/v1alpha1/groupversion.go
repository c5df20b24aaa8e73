// Package v1alpha1 is ferry's cluster API, group ferry.io: the
// UpgradeBundle (one per bundle: the administrator's spec, the summary)
// and the UpgradeBundleNode (one per node: that node's entries). Its Go
// types are the one description of the resources:
// packaging/upgradebundle-crd.yaml is generated from them (make
// generate, controller-gen), and kube/, the CLI and the tests decode
// them.
//
// +kubebuilder:object:generate=true
// +groupName=ferry.io
package v1alpha1

// The group, version and resources the types are served as.
const (
	Group    = "ferry.io"
	Version  = "v1alpha1"
	Resource = "upgradebundles"
	Kind     = "UpgradeBundle"

	NodeResource = "upgradebundlenodes"
	NodeKind     = "UpgradeBundleNode"
)

// APIVersion is the types' apiVersion: ferry.io/v1alpha1.
const APIVersion = Group + "/" + Version
