package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/pacing"
	"github.com/ferry-edge/ferry/peer"
)

// newPeers builds the peer side; serve runs its HTTP server until ctx ends
// (nil when no listen address is configured).
func newPeers(cfg agent.Config, gov *pacing.Governor, log *slog.Logger) (agent.Peers, func(ctx context.Context, a *agent.Agent) error, error) {
	if cfg.Peer.Listen == "" && len(cfg.Peer.Peers) == 0 {
		return nil, nil, nil
	}
	token := ""
	if cfg.Peer.TokenFile != "" {
		b, err := os.ReadFile(cfg.Peer.TokenFile)
		if err != nil {
			return nil, nil, usageError("peer.token_file: %v", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, nil, usageError("peer.token_file %s is empty", cfg.Peer.TokenFile)
		}
	}
	shelf := peer.NewShelf(peer.ShelfOptions{CacheDir: filepath.Join(cfg.Paths.StateDir, "pieces"), Log: log})
	var pacer peer.Pacer
	if gov != nil {
		pacer = gov
	}
	f := peer.NewFetcher(peer.FetcherOptions{Peers: cfg.Peer.Peers, Token: token, Shelf: shelf, Log: log, Pacer: pacer})
	var serve func(ctx context.Context, a *agent.Agent) error
	if cfg.Peer.Listen != "" {
		serve = func(ctx context.Context, a *agent.Agent) error {
			defer shelf.Close()
			srv := peer.NewServer(shelf, peer.ServerOptions{Token: token, Closed: cfg.Peer.Closed(), Status: a.PeerStatus, Log: log, Pacer: pacer})
			if err := srv.ListenAndServe(ctx, cfg.Peer.Listen); err != nil {
				return fmt.Errorf("peer server on %s: %w", cfg.Peer.Listen, err)
			}
			return nil
		}
	}
	return peer.Node{Shelf: shelf, Fetcher: f}, serve, nil
}
