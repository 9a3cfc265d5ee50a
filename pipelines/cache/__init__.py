"""The semantic cache: lookups, similarity, key terms and its admin commands."""
