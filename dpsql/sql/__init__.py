"""SQL text: parsing, the dialect, allow-lists, normalisation, and small facts about names and types."""
