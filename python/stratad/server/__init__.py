"""The gRPC daemon: server lifetime (`app`), interceptors, the service registry."""
