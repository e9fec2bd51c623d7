"""Grading: test logs to statuses (swebench's parsers, pytest's report lines), the fixed-list contract, flaky tests.

:mod:`.log_parsing` (swebench's parsers), :mod:`.pytest_report` (pytest's report lines),
:mod:`.grader` (statuses → the fixed-list contract → utility), :mod:`.flaky` (flaky tests)."""
