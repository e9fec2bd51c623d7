"""``python -m sandbox doctor``'s probes and their verdicts: each reward-integrity rule tried
live on this host through the product's own code paths, judged by :mod:`eval.integrity`
(design page, "Threat model")."""
