package stratad

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	stratadv1 "github.com/stratad/stratad/clients/go/stratadv1"
)

// pageSize is how many items each page of a List call asks for.
const pageSize = 100

// SessionOptions are the optional settings of a new session.
type SessionOptions struct {
	Labels map[string]string
	// KeepLast keeps at most this many unnamed checkpoints (0: no limit).
	KeepLast uint32
	// MaxAge drops unnamed checkpoints older than this (0: no limit).
	MaxAge time.Duration
}

// CreateSession creates a session; the daemon generates an ID when sessionID
// is empty. opts may be nil. A taken ID fails with ErrAlreadyExists.
func (c *Client) CreateSession(ctx context.Context, sessionID string, opts *SessionOptions) (*stratadv1.Session, error) {
	if opts == nil {
		opts = &SessionOptions{}
	}
	resp, err := c.SessionService.CreateSession(ctx, &stratadv1.CreateSessionRequest{
		SessionId: sessionID,
		Labels:    opts.Labels,
		Retention: &stratadv1.RetentionPolicy{
			KeepLast:      opts.KeepLast,
			MaxAgeSeconds: opts.MaxAge.Seconds(),
		},
	})
	return resp.GetSession(), err
}

// GetSession returns a session (ErrNotFound when there is none in the tenant).
func (c *Client) GetSession(ctx context.Context, sessionID string) (*stratadv1.Session, error) {
	resp, err := c.SessionService.GetSession(ctx, &stratadv1.GetSessionRequest{SessionId: sessionID})
	return resp.GetSession(), err
}

// ListSessions returns every session of the tenant whose ID starts with
// prefix ("" for all), ordered by ID, following the pages.
func (c *Client) ListSessions(ctx context.Context, prefix string) ([]*stratadv1.Session, error) {
	var sessions []*stratadv1.Session
	token := ""
	for {
		page, err := c.SessionService.ListSessions(ctx, &stratadv1.ListSessionsRequest{
			Prefix: prefix, PageSize: pageSize, PageToken: token,
		})
		if err != nil {
			return nil, err
		}
		sessions = append(sessions, page.GetSessions()...)
		if token = page.GetNextPageToken(); token == "" {
			return sessions, nil
		}
	}
}

// DeleteSession deletes a session and its checkpoints. expectedVersion 0
// skips the version check; otherwise a session at another version fails with
// ErrVersionConflict.
func (c *Client) DeleteSession(ctx context.Context, sessionID string, expectedVersion uint64) error {
	_, err := c.SessionService.DeleteSession(ctx, &stratadv1.DeleteSessionRequest{
		SessionId: sessionID, ExpectedVersion: expectedVersion,
	})
	return err
}

// SaveOptions are the optional settings of a save.
type SaveOptions struct {
	// ContentType describes the state (opaque to stratad), e.g. "application/json".
	ContentType string
	// Metadata is stored with the checkpoint (JSON values: string, float64,
	// bool, nil, []any, map[string]any; see structpb.NewStruct).
	Metadata map[string]any
	// ExpectedVersion: 0 skips the check; otherwise the save fails with
	// ErrVersionConflict unless the session is at this version.
	ExpectedVersion uint64
	// CheckpointID is the new checkpoint's ID (unique in the tenant; generated when empty).
	CheckpointID string
	// ParentCheckpointID defaults to the latest checkpoint of the namespace.
	ParentCheckpointID string
	Namespace          string
}

// SaveState saves data as a new checkpoint that becomes the session's head.
// opts may be nil.
//
// A state can be at most the daemon's max_message_bytes (64 MiB by default;
// beyond, the save fails with ErrResourceExhausted and nothing is stored).
// It travels whole in one message: the Python SDK's chunked upload, which
// sends only the chunks the daemon lacks (CheckpointService.SaveState with a
// ChunkedState), is not part of this client.
func (c *Client) SaveState(ctx context.Context, sessionID string, data []byte, opts *SaveOptions) (*stratadv1.SaveStateResponse, error) {
	if opts == nil {
		opts = &SaveOptions{}
	}
	meta, err := toStruct(opts.Metadata)
	if err != nil {
		return nil, err
	}
	return c.CheckpointService.SaveState(ctx, &stratadv1.SaveStateRequest{
		SessionId:          sessionID,
		Data:               data,
		ContentType:        opts.ContentType,
		Metadata:           meta,
		ExpectedVersion:    opts.ExpectedVersion,
		CheckpointId:       opts.CheckpointID,
		ParentCheckpointId: opts.ParentCheckpointID,
		Namespace:          opts.Namespace,
	})
}

// LoadOptions pick what LoadState returns; the zero value is the latest state
// of the default namespace.
type LoadOptions struct {
	// CheckpointID loads this checkpoint instead of the latest one.
	CheckpointID string
	Namespace    string
}

// LoadState loads the latest state of a session (or the checkpoint opts
// names; opts may be nil). Its digest was verified by the daemon: stratad
// fails with ErrDataLoss rather than return damaged bytes.
func (c *Client) LoadState(ctx context.Context, sessionID string, opts *LoadOptions) (*stratadv1.LoadStateResponse, error) {
	if opts == nil {
		opts = &LoadOptions{}
	}
	return c.CheckpointService.LoadState(ctx, &stratadv1.LoadStateRequest{
		SessionId: sessionID, CheckpointId: opts.CheckpointID, Namespace: opts.Namespace,
	})
}

// ListCheckpointsOptions filter ListCheckpoints; the zero value lists all.
type ListCheckpointsOptions struct {
	// Namespace, when not nil, lists only checkpoints of this namespace.
	Namespace *string
	// MetadataFilter lists only checkpoints whose metadata has all these fields.
	MetadataFilter map[string]any
	// Before lists only checkpoints created before this checkpoint.
	Before string
}

// ListCheckpoints returns a session's checkpoints, newest first, following
// the pages. opts may be nil.
func (c *Client) ListCheckpoints(ctx context.Context, sessionID string, opts *ListCheckpointsOptions) ([]*stratadv1.Checkpoint, error) {
	if opts == nil {
		opts = &ListCheckpointsOptions{}
	}
	filter, err := toStruct(opts.MetadataFilter)
	if err != nil {
		return nil, err
	}
	var checkpoints []*stratadv1.Checkpoint
	token := ""
	for {
		page, err := c.CheckpointService.ListCheckpoints(ctx, &stratadv1.ListCheckpointsRequest{
			SessionId:      sessionID,
			PageSize:       pageSize,
			PageToken:      token,
			Namespace:      opts.Namespace,
			MetadataFilter: filter,
			Before:         opts.Before,
		})
		if err != nil {
			return nil, err
		}
		checkpoints = append(checkpoints, page.GetCheckpoints()...)
		if token = page.GetNextPageToken(); token == "" {
			return checkpoints, nil
		}
	}
}

// CreateCheckpoint pins the session's current state under a name ("" for
// "checkpoint-<version>"); named checkpoints outlive retention.
func (c *Client) CreateCheckpoint(ctx context.Context, sessionID, name string) (*stratadv1.Checkpoint, error) {
	resp, err := c.CheckpointService.CreateCheckpoint(ctx, &stratadv1.CreateCheckpointRequest{
		SessionId: sessionID, Name: name,
	})
	return resp.GetCheckpoint(), err
}

// RestoreCheckpoint returns a checkpoint's state; with makeCurrent it also
// becomes the session's head again.
func (c *Client) RestoreCheckpoint(ctx context.Context, checkpointID string, makeCurrent bool) (*stratadv1.LoadStateResponse, error) {
	resp, err := c.CheckpointService.RestoreCheckpoint(ctx, &stratadv1.RestoreCheckpointRequest{
		CheckpointId: checkpointID, MakeCurrent: makeCurrent,
	})
	return resp.GetState(), err
}

// DeleteCheckpoint deletes one checkpoint (expectedVersion as for DeleteSession).
func (c *Client) DeleteCheckpoint(ctx context.Context, checkpointID string, expectedVersion uint64) error {
	_, err := c.CheckpointService.DeleteCheckpoint(ctx, &stratadv1.DeleteCheckpointRequest{
		CheckpointId: checkpointID, ExpectedVersion: expectedVersion,
	})
	return err
}

// ForkSession creates a session (newSessionID, generated when empty) whose
// first checkpoint shares the given checkpoint's state; no data is copied.
func (c *Client) ForkSession(ctx context.Context, checkpointID, newSessionID string, labels map[string]string) (*stratadv1.Session, error) {
	resp, err := c.CheckpointService.ForkSession(ctx, &stratadv1.ForkSessionRequest{
		CheckpointId: checkpointID, NewSessionId: newSessionID, Labels: labels,
	})
	return resp.GetSession(), err
}

// toStruct converts JSON-like metadata; nil stays nil (no metadata).
func toStruct(fields map[string]any) (*structpb.Struct, error) {
	if fields == nil {
		return nil, nil
	}
	s, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, fmt.Errorf("stratad: metadata is not JSON-like: %w", err)
	}
	return s, nil
}

// WatchSession yields the session's events as they happen, in version order:
// first those after fromVersion (0: none, only new events), then each new
// mutation. It ends when ctx ends (without an error), when the loop breaks, or
// on the stream's first error, which it yields last (ErrNotFound for a
// missing session; ErrWatcherTooSlow when the loop fell behind: watch again
// from Metadata["resume_from_version"]).
//
//	for event, err := range client.WatchSession(ctx, "chat-42", 0) {
//		if err != nil { return err }
//		fmt.Println(event.GetVersion(), event.GetKind())
//	}
func (c *Client) WatchSession(ctx context.Context, sessionID string, fromVersion uint64) iter.Seq2[*stratadv1.SessionEvent, error] {
	return func(yield func(*stratadv1.SessionEvent, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // a loop that breaks ends the stream
		stream, err := c.SessionService.WatchSession(ctx, &stratadv1.WatchSessionRequest{
			SessionId: sessionID, FromVersion: fromVersion,
		})
		for err == nil {
			var response *stratadv1.WatchSessionResponse
			if response, err = stream.Recv(); err == nil && !yield(response.GetEvent(), nil) {
				return
			}
		}
		if !errors.Is(err, io.EOF) && ctx.Err() == nil {
			yield(nil, err)
		}
	}
}
