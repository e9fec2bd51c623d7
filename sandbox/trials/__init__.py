"""Verifier trials: the spec and result records, the in-sandbox script, the host-side watch, the protected set, the pool of concurrent trials."""
