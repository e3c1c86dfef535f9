"""The version of keras-attn: the one place it is written (setup.cfg and CHANGELOG.md read it)."""

__version__ = "0.3.0"
