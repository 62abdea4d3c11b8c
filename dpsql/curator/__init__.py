"""The curator's tools: bound suggestions, the dropped-share estimate, build progress."""
