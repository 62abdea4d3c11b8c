"""A query's stages after the analysis: options, preparing, the charge and run, release, accuracy."""
