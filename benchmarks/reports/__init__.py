"""What a run says afterwards: the results table, summary and report, plots, statistics, and the
progress bar while it runs."""
