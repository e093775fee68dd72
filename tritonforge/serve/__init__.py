"""Running tritonserver: the launcher (server.py), its supervisor and the liveness probes it sends."""
