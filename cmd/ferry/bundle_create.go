package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/ferry-edge/ferry/bundle"
)

func init() {
	register(&command{name: "bundle create", summary: "copy a release and extra images into an upgrade bundle (connected side)", run: runBundleCreate})
}

var (
	createFlags      = newFlagSet("bundle create", "")
	createRelease    = createFlags.String("release", "", "release image (e.g. quay.io/openshift-release-dev/ocp-release:4.13.7-x86_64 or …@sha256:…); default: that of --version and --arch")
	createVersion    = createFlags.String("version", "", "bundle version (default: the release image's release-metadata)")
	createArch       = createFlags.String("arch", "", "x86_64, aarch64, ppc64le or s390x (default: the release image's architecture)")
	createExtraFile  = createFlags.String("extra-images-file", "", "file of extra images, one a line (# comments, blank lines ignored)")
	createPullSecret = createFlags.String("pull-secret", "", "registry credentials: a pull secret or auth.json ({\"auths\": {...}})")
	createCertDir    = createFlags.String("cert-dir", "", "certs.d-style directory of registry CAs: <dir>/<host[:port]>/ca.crt")
	createTLSVerify  = createFlags.Bool("tls-verify", true, "verify registries' TLS certificates (false also allows plain HTTP)")
	createOutput     = createFlags.String("output", ".", "directory for upgrade-<version>-<arch>.tar, .sha256 and .tar.minisig")
	createSignKey    = createFlags.String("sign-key", "", "minisign secret key to sign the bundle with (password from $FERRY_SIGN_PASSWORD if it has one)")
	createPlatforms  = createFlags.String("platforms", bundle.PlatformsArch, "manifest lists: 'arch' keeps the list but copies only its linux/<arch> images; 'all' copies every platform")
	createSignatures = createFlags.String("signatures", bundle.SignaturesAll, "sigstore signatures (cosign's sha256-<hex>.sig tags) to copy: 'all' images that have any, or only the 'release' image's")
	createWorkDir    = createFlags.String("work-dir", "", "where the registry tree is built (default <output>/.ferry-work-<version>-<arch>); a rerun after an interruption reuses it")
	createKeepWork   = createFlags.Bool("keep-work-dir", false, "keep the work directory after success")
	createJobs       = createFlags.Int("jobs", 4, "images copied at once")
	createQuiet      = createFlags.Bool("quiet", false, "no progress output")
	createSigStore   = createFlags.String("signature-store", signatureStoreDefault(), "where the release's signatures are fetched when no --release-signature is given (<URL>/sha256=<hex>/signature-N); \"\" for none")
	createExtras     multiFlag
	createMirrors    multiFlag
	createSigFiles   multiFlag
)

// signatureStoreDefault is the public store, or $FERRY_SIGNATURE_STORE when
// set (even empty: tests and sites with no route to it).
func signatureStoreDefault() string {
	if v, ok := os.LookupEnv("FERRY_SIGNATURE_STORE"); ok {
		return v
	}
	return bundle.DefaultSignatureStore
}

func init() {
	createFlags.Var(&createExtras, "extra-image", "extra image to include, by tag or digest (repeatable; a tag is resolved and kept)")
	createFlags.Var(&createSigFiles, "release-signature", "a signature file of the release image, as a signature store serves it (repeatable)")
	createFlags.Var(&createMirrors, "mirror", "PREFIX=LOCATION: fetch images whose name starts with PREFIX from LOCATION, keep the original name (repeatable)")
}

func runBundleCreate(ctx context.Context, args []string) error {
	if err := parseFlags(createFlags, args); err != nil {
		return err
	}
	if createFlags.NArg() > 0 {
		return usageError("unexpected argument %q", createFlags.Arg(0))
	}
	if *createRelease == "" {
		if *createVersion == "" || *createArch == "" {
			return usageError("--release, or --version and --arch, is required")
		}
		*createRelease = bundle.ReleaseImage(*createVersion, *createArch)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o := bundle.CreateOptions{
		Release:     *createRelease,
		Version:     *createVersion,
		Arch:        *createArch,
		ExtraImages: createExtras,
		Platforms:   *createPlatforms,
		Signatures:  *createSignatures,
		Insecure:    !*createTLSVerify,
		OutputDir:   *createOutput,
		WorkDir:     *createWorkDir,
		KeepWork:    *createKeepWork,
		Jobs:        *createJobs,
		Log:         log,
	}
	if o.Arch != "" && bundle.UnameArch(o.Arch) == "" {
		return usageError("--arch %q: want x86_64, aarch64, ppc64le or s390x", o.Arch)
	}
	if o.Platforms != bundle.PlatformsArch && o.Platforms != bundle.PlatformsAll {
		return usageError("--platforms %q: want arch or all", o.Platforms)
	}
	if o.Signatures != bundle.SignaturesAll && o.Signatures != bundle.SignaturesRelease {
		return usageError("--signatures %q: want all or release", o.Signatures)
	}
	if *createExtraFile != "" {
		more, err := bundle.ReadImageList(*createExtraFile)
		if err != nil {
			return usageError("--extra-images-file: %v", err)
		}
		o.ExtraImages = append(o.ExtraImages, more...)
	}
	for _, m := range createMirrors {
		mm, err := bundle.ParseMirror(m)
		if err != nil {
			return usageError("--mirror: %v", err)
		}
		o.Mirrors = append(o.Mirrors, mm)
	}
	var err error
	if o.Transport, err = bundle.NewTransport(*createCertDir, *createTLSVerify); err != nil {
		return usageError("%v", err)
	}
	if *createPullSecret != "" {
		if o.Keychain, err = bundle.LoadPullSecret(*createPullSecret); err != nil {
			return usageError("%v", err)
		}
	}
	for _, f := range createSigFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return usageError("--release-signature: %v", err)
		}
		o.ReleaseSignatures = append(o.ReleaseSignatures, b)
	}
	o.SignatureStore = *createSigStore
	if *createSignKey != "" {
		key, err := bundle.LoadSignKey(*createSignKey, os.Getenv("FERRY_SIGN_PASSWORD"))
		if err != nil {
			return usageError("--sign-key: %v", err)
		}
		o.SignKey = &key
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return usageError("SOURCE_DATE_EPOCH %q is not a number of seconds", s)
		}
		o.Created = time.Unix(sec, 0)
	}
	if !*createQuiet {
		fi, err := os.Stderr.Stat()
		terminal := err == nil && fi.Mode()&os.ModeCharDevice != 0
		o.Progress = bundle.ProgressPrinter(os.Stderr, terminal, log, 5*time.Second)
		if terminal {
			// Log lines would break the progress line: only warnings.
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
	}
	res, err := bundle.Create(ctx, o)
	if err != nil {
		return err
	}
	fmt.Printf("%s\n", res.TarPath)
	log.Info("bundle created", "tar", res.TarPath, "digest", res.Digest, "size", bundle.HumanSize(res.TarSize),
		"images", len(res.Metadata.AllImages()), "blobsFetched", res.BlobsFetched, "blobsReused", res.BlobsReused)
	return nil
}
