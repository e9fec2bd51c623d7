"""The facts of a sandbox host that the reward-integrity rules rely on, and the gate that a
Ray sandbox node passes before it serves (design page, "Threat model")."""
