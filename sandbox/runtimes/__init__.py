"""Runtimes on this machine: Podman (podman-py) and the unisolated local runtime."""
