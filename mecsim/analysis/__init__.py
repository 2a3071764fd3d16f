"""What is made of records: replay, what-if sweeps, summaries, tables, plots."""
