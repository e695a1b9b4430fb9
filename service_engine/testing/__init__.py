"""Test support: seams tests plug into (fault injection, ...).

Never imported by the engine itself.
"""
