"""The curator's policy: its language, its model and its checks against the database."""
