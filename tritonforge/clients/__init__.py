"""What reaches a served repository from outside: the gRPC and HTTP clients and the OpenAI-compatible
gateway with its workers and metrics."""
