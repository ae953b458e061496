"""Command-line interface: ``distpm run``, ``distpm info``."""
