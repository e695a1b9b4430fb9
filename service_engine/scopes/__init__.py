"""Scope declaration at boot: the manifest (pure) and the handshake with Identity."""
