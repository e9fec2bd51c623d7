"""``python -m sandbox doctor``'s probes and their verdicts: each reward-integrity rule tried
live on this host through the product's own code paths, judged by :mod:`eval.integrity`
(design page, "Threat model").

:mod:`.probes` (the agent's container and tree), :mod:`.trial_probes` (verifier trials),
:mod:`.verdicts` (the adapter to :mod:`eval.integrity`), :mod:`.cli` and :mod:`.__main__`
(``python -m eval.doctor``, what ``ecredit-sandbox doctor`` runs)."""
