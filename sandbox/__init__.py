"""Execution: the lowest layer. Git snapshots and restore, verifier trials, the local Podman
runtime, rollout workspaces, the Ray cluster backend and images.

Knows nothing of training or grading; the package face is empty on purpose, so that importing
one subpackage never imports the others (see the design page, "Layers").
"""
