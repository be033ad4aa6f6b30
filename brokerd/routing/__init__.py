"""Topic names, topic filters and the tries that match them (pure Python)."""
