"""Grading: test logs to statuses (swebench's parsers, pytest's report lines), the fixed-list contract, flaky tests."""
