"""Safe git and snapshots: private git directories, turn snapshots, restore, the verifier's base tree. The bottom of sandbox/: imports nothing else of it."""
