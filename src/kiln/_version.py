"""The Kiln version: its own module so that every layer can read it without importing the
``kiln`` package facade (which sits on top of the layer table)."""

__version__ = "0.1.0"
