"""Tasks: the schema and row validation, split loaders, sealed holdouts, adapters, bundled task building, task images and their presence, the trial spec of a task."""
