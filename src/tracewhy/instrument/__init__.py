"""The capture side: helpers that run inside the user's job (none yet)."""
