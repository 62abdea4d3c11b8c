"""The answer an analyst reads: the result object, its notes, its explanation."""
