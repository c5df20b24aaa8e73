package main

// Examples of each command, as the guides (README.md, docs/admin.md,
// docs/technician.md, docs/engineer.md) use them; -h prints them.
var examples = map[string]string{
	"ferry": `  # What the agent on this node is doing
  ferry status
  # Check a bundle on a stick before taking it to the site
  ferry bundle verify /media/stick/upgrade-4.13.7-x86_64.tar --arch x86_64`,
	"ferry agent": `  # As ferry.service runs it (reads /etc/ferry/config.toml)
  ferry agent
  # With another config
  ferry agent --config /etc/ferry/lab.toml`,
	"ferry status": `  # This node: the status line, the bundle, its phases (exit 1 if the agent is down or unhealthy)
  ferry status
  # Every node's phase and the cluster gate, with their addresses and versions
  ferry status --cluster -o wide
  # Everything behind the line, for a script
  ferry status -o json`,
	"ferry load": `  # A bundle copied to the node (its .sha256, and .minisig, beside it)
  ferry load /root/upgrade-4.13.7-x86_64.tar
  # Registry mode: pull a release and an extra image from the site's registry
  ferry load --release quay.io/openshift-release-dev/ocp-release@sha256:<64 hex> \
    --extra-image quay.io/my-company/my-workload:v1`,
	"ferry proceed": `  # Start the upgrade now (schedule = "Manual"), then follow it
  ferry proceed
  ferry status --cluster`,
	"ferry cleanup": `  # The upgrade is done: remove the bundle's files, registry and mirror
  ferry cleanup`,
	"ferry approve": `  # Before the stick arrives: approve the engineer's bundle (and its release, the tar beside it)
  ferry approve /srv/bundles/upgrade-4.13.7-x86_64.sha256
  # Hold the upgrade for proceed once every node is loaded
  ferry approve upgrade-4.13.7-x86_64.sha256 --bundle /media/stick/upgrade-4.13.7-x86_64.tar --schedule Manual
  # Then wait for the nodes to take it
  kubectl wait --for=condition=Approved upgradebundle/4.13.7-x86-64 --timeout=30m`,
	"ferry config": `  ferry config check --config /etc/ferry/config.toml`,
	"ferry config check": `  # The agent's config, as the agent reads it (exit 2 if it is bad)
  ferry config check
  # A new config, before installing it
  ferry config check --config ./config.toml`,
	"ferry bundle": `  ferry bundle inspect /media/stick/upgrade-4.13.7-x86_64.tar`,
	"ferry bundle create": `  # A release and an extra image, written to a stick
  ferry bundle create --release quay.io/openshift-release-dev/ocp-release:4.13.7-x86_64 \
    --extra-image quay.io/my-company/my-workload:v1 --pull-secret pull-secret.json --output /media/stick
  # By version and arch, signed with the site's minisign key
  ferry bundle create --version 4.13.7 --arch x86_64 --sign-key ferry.key --output /media/stick
  # An EUS-to-EUS path on one stick: every image of both releases, once
  ferry bundle create --release 4.17.20 --release 4.18.10 --arch x86_64 --pull-secret pull-secret.json --output /media/stick`,
	"ferry bundle inspect": `  ferry bundle inspect /media/stick/upgrade-4.13.7-x86_64.tar
  # metadata.json, for a script
  ferry bundle inspect /media/stick/upgrade-4.13.7-x86_64.tar -o json`,
	"ferry bundle verify": `  ferry bundle verify /media/stick/upgrade-4.13.7-x86_64.tar --arch x86_64
  # Approved by its signature: the key the bundle was signed with
  ferry bundle verify /media/stick/upgrade-4.13.7-x86_64.tar --trusted-key ferry.pub`,
	"ferry bundle extract": `  ferry bundle extract /media/stick/upgrade-4.13.7-x86_64.tar --dest /var/lib/upgrade/4.13.7-x86_64`,
	"ferry completion": `  # For this shell
  source <(ferry completion bash)
  # For every bash session
  ferry completion bash > /etc/bash_completion.d/ferry`,
	"ferry version": `  ferry version
  ferry version -o json`,
}
