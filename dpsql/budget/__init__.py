"""Privacy accounting and the persistent ledger."""
