"""Reports: a study's results table and report.md with significance tests, per-unit statistics, search
importances and plots."""
