// Package stratad is the Go client of stratad, the durable state sidecar for
// AI agents: a thin, typed layer over the generated gRPC stubs of
// stratad.api.v1 (package stratadv1).
//
// A Client connects as the Python SDK does: the options given, else the
// STRATAD_ADDRESS, STRATAD_TENANT, STRATAD_TOKEN / STRATAD_TOKEN_FILE and
// STRATAD_TLS* variables, else plaintext to 127.0.0.1:50051. Every call it
// makes (through its methods or the raw stubs it exposes) carries the tenant
// header and the bearer token, gets a deadline when its context has none, is
// retried by gRPC when it fails with UNAVAILABLE before reaching the daemon,
// and fails with an *Error carrying the daemon's reason:
//
//	client, err := stratad.New(ctx)
//	if err != nil { ... }
//	defer client.Close()
//	saved, err := client.SaveState(ctx, "chat-42", []byte(`{"messages": []}`),
//		&stratad.SaveOptions{ContentType: "application/json", ExpectedVersion: version})
//	if errors.Is(err, stratad.ErrVersionConflict) {
//		// someone saved first: reload, merge, retry
//	}
//
// The methods cover sessions and checkpoints (create, get, list, delete,
// save, load, list checkpoints, name, restore, fork, watch). Every other RPC is
// reachable through the Client's stub fields (TaskService, CognitiveStateService,
// AdminService, ...), with the same metadata, deadlines, retries and errors.
package stratad
