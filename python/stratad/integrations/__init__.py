"""Adapters that let agent frameworks keep their state in stratad.

Each adapter lives in its own module and imports its framework only there,
so `import stratad` never needs them (install the matching extra, e.g.
`pip install stratad[langgraph]`).
"""
