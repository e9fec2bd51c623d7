"""Tasks: the schema and row validation, split loaders, sealed holdouts, adapters, bundled task building, task images and their presence, the trial spec of a task.

:mod:`.schema` (the task schema, row validation), :mod:`.splits` (the split loader),
:mod:`.sealed` (sealed holdouts, the training guard), :mod:`.adapters` (training-set rows),
:mod:`.bundled` (bundled task building), :mod:`.presence` (task images present),
:mod:`.trialspec` (a task's verifier trial and limits), :mod:`.protection` (its protected
set), :mod:`.harmful` (the positive control's harmful edit), :mod:`.fingerprints` (the changes
a gold patch makes: one bug recognised under two ids)."""
