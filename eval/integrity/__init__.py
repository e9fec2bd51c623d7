"""Reward integrity: every rule that decides whether an observation is scored, charged to the policy or excluded."""
