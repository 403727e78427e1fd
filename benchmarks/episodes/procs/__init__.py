"""Several runner processes on one run: worker processes claim episodes from the parent, which writes the ledger."""
