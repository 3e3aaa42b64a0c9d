// Quickstart: save, load, list and fork with the stratad Go client.
//
//	STRATAD_ADDRESS=127.0.0.1:50051 go run ./examples/quickstart
//
// It connects as every stratad client does (STRATAD_ADDRESS, STRATAD_TENANT,
// STRATAD_TOKEN or STRATAD_TOKEN_FILE, STRATAD_TLS*), keeps a conversation in
// the session "quickstart" (-session), and forks it from its first checkpoint
// into "<session>-fork". Run it again and it goes on where it left off.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"time"

	stratad "github.com/stratad/stratad/clients/go"
)

type conversation struct {
	Messages []string `json:"messages"`
}

func main() {
	sessionID := flag.String("session", "quickstart", "the session to keep the conversation in")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, *sessionID); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, sessionID string) error {
	client, err := stratad.New(ctx) // address, tenant, token and TLS from STRATAD_*
	if err != nil {
		return err
	}
	defer client.Close()

	// Create the session once; a second run finds it there.
	_, err = client.CreateSession(ctx, sessionID, &stratad.SessionOptions{KeepLast: 100})
	if err != nil && !errors.Is(err, stratad.ErrAlreadyExists) {
		return err
	}

	// Load the latest state, if any (a new session has none yet).
	var state conversation
	version := uint64(0)
	latest, err := client.LoadState(ctx, sessionID, nil)
	switch {
	case err == nil:
		if err := json.Unmarshal(latest.GetData(), &state); err != nil {
			return fmt.Errorf("the saved state is not a conversation: %w", err)
		}
		version = latest.GetVersion()
	case !errors.Is(err, stratad.ErrNotFound):
		return err
	}

	// Save two steps. ExpectedVersion makes a save fail with
	// ErrVersionConflict when another writer saved in between.
	for _, message := range []string{"user: hello", "agent: hi, how can I help?"} {
		state.Messages = append(state.Messages, message)
		data, err := json.Marshal(state)
		if err != nil {
			return err
		}
		saved, err := client.SaveState(ctx, sessionID, data, &stratad.SaveOptions{
			ContentType:     "application/json",
			Metadata:        map[string]any{"messages": len(state.Messages)},
			ExpectedVersion: version,
		})
		if errors.Is(err, stratad.ErrVersionConflict) {
			return fmt.Errorf("someone else saved %s first: reload and retry: %w", sessionID, err)
		}
		if err != nil {
			return err
		}
		version = saved.GetVersion()
		fmt.Printf("saved %s: version %d, %d bytes, %d stored\n",
			saved.GetCheckpointId(), saved.GetVersion(), saved.GetSize(), saved.GetStoredBytes())
	}

	loaded, err := client.LoadState(ctx, sessionID, nil)
	if err != nil {
		return err
	}
	fmt.Printf("loaded %s: %s\n", loaded.GetCheckpointId(), loaded.GetData())

	checkpoints, err := client.ListCheckpoints(ctx, sessionID, nil)
	if err != nil {
		return err
	}
	fmt.Printf("%s has %d checkpoints (newest first):\n", sessionID, len(checkpoints))
	for _, c := range checkpoints {
		fmt.Printf("  %s  version %d  %d bytes\n", c.GetCheckpointId(), c.GetVersion(), c.GetSize())
	}

	// Fork from the oldest checkpoint: a new session that shares its state.
	forkID := sessionID + "-fork"
	oldest := checkpoints[len(checkpoints)-1]
	if err := client.DeleteSession(ctx, forkID, 0); err != nil && !errors.Is(err, stratad.ErrNotFound) {
		return err
	}
	fork, err := client.ForkSession(ctx, oldest.GetCheckpointId(), forkID, map[string]string{"forked": "quickstart"})
	if err != nil {
		return err
	}
	forked, err := client.LoadState(ctx, fork.GetSessionId(), nil)
	if err != nil {
		return err
	}
	fmt.Printf("forked %s from %s: %s\n", fork.GetSessionId(), oldest.GetCheckpointId(), forked.GetData())
	return nil
}
