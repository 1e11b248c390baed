"""The offline preference run owner (rm, dpo)."""
