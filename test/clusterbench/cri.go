package clusterbench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI is a CRI-O stand-in for one node of the benchmark: N real CRI-Os
// do not fit on one machine, and the API's cost of a cluster at work
// does not depend on what a pull writes to disk. On one unix socket it
// answers CRI's image service (PullImage, ImageStatus, ListImages,
// RemoveImage) and CRI-O's HTTP /config, as the agent's loader uses them.
// A pull fetches the image's manifest through the mirror the node's
// registries.conf.d names for its repository (ferry's embedded registry;
// TLS unchecked, as CRI-O does for 127.0.0.0/8), checks its digest, waits
// the given delay (so that a node holds its load a while, as a real one
// does) and records the reference; a repository with no mirror is
// "manifest unknown", as on a node with no way out. An image is pinned
// when the pinned_images of the node's crio.conf.d say so, read as CRI-O
// reads them (the last file that sets the key wins) each time it is
// asked: the node's reload is "none", so the stand-in is always reloaded.
// The load itself is proven against a real CRI-O elsewhere (test/e2e).
type CRI struct {
	Socket        string
	ConfDir       string // the node's crio.conf.d
	RegistriesDir string // its registries.conf.d

	delay  time.Duration
	mu     sync.Mutex
	images map[string]bool // pulled references
}

// StartCRI serves a stand-in on a socket in dir until t ends, reading
// the drop-ins of the node's crio.conf.d and registries.conf.d; each pull
// takes delay beyond its manifest's fetch.
func StartCRI(t testing.TB, dir, confDir, registriesDir string, delay time.Duration) *CRI {
	t.Helper()
	c := &CRI{Socket: filepath.Join(dir, "crio.sock"), ConfDir: confDir, RegistriesDir: registriesDir, delay: delay, images: map[string]bool{}}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", c.Socket)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	runtimeapi.RegisterImageServiceServer(g, &imageService{c: c})
	runtimeapi.RegisterRuntimeServiceServer(g, runtimeService{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config", c.serveConfig)
	// gRPC (HTTP/2 with prior knowledge, as grpc-go dials a unix socket)
	// and CRI-O's HTTP/1.1 inspect endpoints share the socket, as CRI-O's.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); g.Stop() })
	return c
}

// pins are the pinned_images CRI-O would run with: those of the last
// file in crio.conf.d (in name order) that sets the key.
func (c *CRI) pins() []string {
	ents, _ := os.ReadDir(c.ConfDir)
	var pins []string
	for _, e := range ents {
		var conf struct {
			Crio struct {
				Image struct {
					PinnedImages *[]string `toml:"pinned_images"`
				} `toml:"image"`
			} `toml:"crio"`
		}
		if _, err := toml.DecodeFile(filepath.Join(c.ConfDir, e.Name()), &conf); err == nil && conf.Crio.Image.PinnedImages != nil {
			pins = *conf.Crio.Image.PinnedImages
		}
	}
	return pins
}

// pinnedBy tells whether ref matches one of pins as CRI-O matches them:
// "*kw*" contains kw, "prefix*" starts with prefix, else exactly.
func pinnedBy(pins []string, ref string) bool {
	for _, p := range pins {
		switch {
		case len(p) > 1 && strings.HasPrefix(p, "*") && strings.HasSuffix(p, "*"):
			if strings.Contains(ref, p[1:len(p)-1]) {
				return true
			}
		case strings.HasSuffix(p, "*"):
			if strings.HasPrefix(ref, p[:len(p)-1]) {
				return true
			}
		case p == ref:
			return true
		}
	}
	return false
}

func (c *CRI) serveConfig(w http.ResponseWriter, _ *http.Request) {
	var conf struct {
		Crio struct {
			Image struct {
				PinnedImages []string `toml:"pinned_images"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	conf.Crio.Image.PinnedImages = c.pins()
	if conf.Crio.Image.PinnedImages == nil {
		conf.Crio.Image.PinnedImages = []string{}
	}
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(conf); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Write(b.Bytes())
}

// image is ref as CRI lists it: one image per reference pulled.
func (c *CRI) image(ref string, pins []string) *runtimeapi.Image {
	sum := sha256.Sum256([]byte(ref))
	img := &runtimeapi.Image{Id: hex.EncodeToString(sum[:]), Size: 1 << 20, Pinned: pinnedBy(pins, ref)}
	if strings.Contains(ref, "@") {
		img.RepoDigests = []string{ref}
	} else {
		img.RepoTags = []string{ref}
	}
	return img
}

type imageService struct {
	runtimeapi.UnimplementedImageServiceServer
	c *CRI
}

func (s *imageService) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, status.Error(codes.InvalidArgument, "no image")
	}
	if err := s.c.fetchManifest(ctx, ref); err != nil {
		return nil, status.Errorf(codes.Unknown, "initializing source docker://%s: reading manifest: %v", ref, err)
	}
	t := time.NewTimer(s.c.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-t.C:
	}
	s.c.mu.Lock()
	s.c.images[ref] = true
	s.c.mu.Unlock()
	return &runtimeapi.PullImageResponse{ImageRef: ref}, nil
}

func (s *imageService) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	ref := req.GetImage().GetImage()
	s.c.mu.Lock()
	have := s.c.images[ref]
	s.c.mu.Unlock()
	if !have {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: s.c.image(ref, s.c.pins())}, nil
}

func (s *imageService) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	pins := s.c.pins()
	s.c.mu.Lock()
	refs := make([]string, 0, len(s.c.images))
	for r := range s.c.images {
		refs = append(refs, r)
	}
	s.c.mu.Unlock()
	slices.Sort(refs)
	out := &runtimeapi.ListImagesResponse{}
	for _, r := range refs {
		out.Images = append(out.Images, s.c.image(r, pins))
	}
	return out, nil
}

func (s *imageService) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	s.c.mu.Lock()
	delete(s.c.images, req.GetImage().GetImage())
	s.c.mu.Unlock()
	return &runtimeapi.RemoveImageResponse{}, nil
}

type runtimeService struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (runtimeService) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "cri-o-stand-in", RuntimeVersion: "1.34.0", RuntimeApiVersion: "v1"}, nil
}

// mirrorClient fetches manifests from the nodes' embedded registries.
var mirrorClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 1, IdleConnTimeout: 5 * time.Second}}

var errManifestUnknown = errors.New("manifest unknown")

// fetchManifest gets ref's manifest (ref is registry/name[:tag]@sha256:…)
// from the first mirror the node's registries.conf.d gives its
// repository, and checks its digest.
func (c *CRI) fetchManifest(ctx context.Context, ref string) error {
	name, dgst, ok := strings.Cut(ref, "@")
	if !ok {
		return fmt.Errorf("%w: %s is not by digest", errManifestUnknown, ref)
	}
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	mirror := c.mirrorOf(name)
	if mirror == "" {
		return fmt.Errorf("%w: no mirror of %s and no way out", errManifestUnknown, name)
	}
	host, path, _ := strings.Cut(mirror, "/")
	req, err := http.NewRequestWithContext(ctx, "GET", "https://"+host+"/v2/"+path+"/manifests/"+dgst, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json")
	resp, err := mirrorClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s answered %s", errManifestUnknown, mirror, resp.Status)
	}
	if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != dgst {
		return fmt.Errorf("manifest digest did not match: %s from %s", ref, mirror)
	}
	return nil
}

// mirrorOf is the first mirror location of repository name in the
// node's registries.conf.d ("" for none).
func (c *CRI) mirrorOf(name string) string {
	ents, _ := os.ReadDir(c.RegistriesDir)
	for _, e := range ents {
		var conf struct {
			Registry []struct {
				Prefix   string `toml:"prefix"`
				Location string `toml:"location"`
				Mirror   []struct {
					Location string `toml:"location"`
				} `toml:"mirror"`
			} `toml:"registry"`
		}
		if _, err := toml.DecodeFile(filepath.Join(c.RegistriesDir, e.Name()), &conf); err != nil {
			continue
		}
		for _, r := range conf.Registry {
			if (r.Prefix == name || r.Prefix == "" && r.Location == name) && len(r.Mirror) > 0 {
				return r.Mirror[0].Location
			}
		}
	}
	return ""
}
