"""The Ray backend: verifier trials as Ray tasks and rollout workspaces as actors on sandbox nodes, each with its own Podman."""
